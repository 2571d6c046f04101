"""The platform facts table: hand-computed cases from the sources named in the module."""

import pytest

from components.platform import platform_facts as facts
from components.platform.kfp_backend import KFP_FEATURE_FLOORS, kfp_backend_floor

pytestmark = pytest.mark.unit


def test_every_fact_table_names_its_source() -> None:
    for source in (facts.ACCELERATORS_SOURCE, facts.MACHINES_SOURCE, facts.GKE_ALLOCATABLE_SOURCE):
        assert "cloud.google.com" in source
    assert all(source for _, source in KFP_FEATURE_FLOORS.values())


def test_names_map_both_ways() -> None:
    assert facts.accelerator("nvidia-l4") is facts.accelerator("NVIDIA_L4")
    assert facts.gke_accelerator("NVIDIA_H100_80GB") == "nvidia-h100-80gb"
    assert facts.gke_accelerator("") is None
    with pytest.raises(ValueError, match="NVIDIA_L4"):
        facts.accelerator("nvidia-l5")


@pytest.mark.parametrize(
    "cuda_name, tflops",
    [
        # What torch.cuda.get_device_name reports on each (NVIDIA's own names).
        ("NVIDIA H100 80GB HBM3", 989.5),
        ("NVIDIA H100 NVL", 835.5),
        ("NVIDIA H100 PCIe", 756),
        ("NVIDIA H200", 989.5),
        ("NVIDIA A100-SXM4-40GB", 312),
        ("NVIDIA A10G", 125),
        ("NVIDIA L40S", 362),
        ("NVIDIA L4", 121),
        ("Tesla T4", 65),
        ("Tesla V100-SXM2-16GB", 125),
        ("Tesla V100-PCIE-16GB", 112),
        ("Tesla V100S-PCIE-32GB", 130),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_one_peak_per_gpu_for_the_trainer_and_the_platform_table(
    cuda_name: str, tflops: float | None
) -> None:
    """The MFU denominator is held once (trainer/gpu_peaks.py): the trainer finds it by the CUDA
    device name (a variant before the name it contains: "A100" is not "A10", "L40S" not "L4"),
    and every accelerator of the platform table by its key, so the cost estimate and the
    trainer's MFU use the same figure."""
    from trainer.gpu_peaks import peak_of

    assert peak_of(cuda_name) == (tflops * 1e12 if tflops else None)
    for gpu in facts.ACCELERATORS:
        assert gpu.peak_tflops * 1e12 == peak_of(f"NVIDIA {gpu.cuda_name}"), gpu
    assert facts.accelerator("NVIDIA_H100_80GB").peak_tflops == 989.5


def test_e2_standard_8_allocatable_by_hand() -> None:
    # CPU: 8 - (0.06 + 0.01 + 2 * 0.005 + 4 * 0.0025) = 7.91, minus the 0.5 system-pod margin.
    # Memory: 32 - (1 + 0.8 + 0.8 + 16 * 0.06) - 100/1024 = 28.342 GiB, minus the 1 GiB margin.
    room = facts.gke_allocatable("e2-standard-8")
    assert room == facts.Allocatable(cpu=7.41, memory_gib=27.342)
    assert facts.gke_fit_error("preprocess", "8", "32G", "e2-standard-8")
    assert facts.gke_fit_error("preprocess", "2", "8G", "e2-standard-8") is None


@pytest.mark.parametrize(
    ("machine", "gpu", "count", "ok"),
    [
        ("g2-standard-24", "nvidia-l4", 2, True),
        ("a3-highgpu-8g", "nvidia-l4", 8, False),  # the deploy guide's old one-liner (audit N3)
        ("a3-highgpu-8g", "NVIDIA_H100_80GB", 8, True),
        ("a3-highgpu-8g", "NVIDIA_H100_80GB", 4, False),
        ("a3-megagpu-8g", "nvidia-h100-mega-80gb", 8, True),
        ("a2-ultragpu-1g", "NVIDIA_A100_80GB", 1, True),
        ("a2-highgpu-1g", "NVIDIA_A100_80GB", 1, False),
        ("n1-standard-8", "NVIDIA_TESLA_T4", 2, True),
        ("n1-standard-8", "NVIDIA_TESLA_T4", 3, False),
        ("n1-standard-8", "NVIDIA_L4", 1, False),
        ("e2-standard-8", "NVIDIA_L4", 1, False),
    ],
)
def test_machine_accelerator_pairs(machine: str, gpu: str, count: int, ok: bool) -> None:
    errors = facts.machine_accelerator_errors(machine, gpu, count)
    assert (errors == []) is ok, errors


def test_refusal_names_the_fix() -> None:
    (error,) = facts.machine_accelerator_errors("a3-highgpu-8g", "nvidia-l4", 2)
    assert "g2-standard-24" in error
    (error,) = facts.machine_accelerator_errors("a3-highgpu-8g", "", 0)
    assert "accelerator_type=NVIDIA_H100_80GB" in error


def test_pipeline_job_uuid_floor_is_2_5_0() -> None:
    """Review P3: resolve.go is absent at 2.4.0 and 2.4.1 copies the placeholder as a constant;
    driver.go:1648@2.5.0 (#11599) first substitutes it."""
    floor, source = KFP_FEATURE_FLOORS["pipeline_job_uuid placeholder"]
    assert floor == (2, 5, 0) and "2.5.0" in source


def test_kfp_floor_is_the_newest_feature() -> None:
    assert kfp_backend_floor() == (2, 16, 0)
    assert facts.quantity("500m") == 0.5 and facts.quantity("28Gi") == 28 * 2**30


def test_machine_table_corrections() -> None:
    """Review P5: n2-highmem-128 has 864 GB (not 128 x 8); n1-highmem-1 and n1-highcpu-1 do not
    exist (N1 high-memory and high-CPU start at 2 vCPUs), while n1-standard-1 does."""
    n2 = facts.machine("n2-highmem-128")
    assert n2 is not None and n2.memory_gib == 864
    assert facts.machine("n2-highmem-96") == facts.Machine("n2-highmem-96", 96, 768)
    assert facts.machine("n1-highmem-1") is None and facts.machine("n1-highcpu-1") is None
    assert facts.machine("n1-standard-1") is not None and facts.machine("n1-highmem-2") is not None


@pytest.mark.parametrize("name", ["NVIDIA_GB200", "NVIDIA_RTX_PRO_6000", "NVIDIA_TESLA_P100"])
def test_a_vertex_accelerator_the_table_lacks_is_allowed_with_a_warning(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Review P5: a member of aiplatform_v1.AcceleratorType missing from ACCELERATORS is a real
    GPU: Vertex judges it at create time, so it is not refused here, only warned about. A GKE
    launch still needs its node label, which the table does not have."""
    from google.cloud.aiplatform_v1 import AcceleratorType

    assert name in AcceleratorType.__members__ and facts.unlisted_vertex_accelerator(name)
    machine_type = "n1-standard-8" if name == "NVIDIA_TESLA_P100" else "a4x-highgpu-4g"
    with caplog.at_level("WARNING", logger=facts.__name__):
        assert facts.machine_accelerator_errors(machine_type, name, 4) == []
    assert f"{name} is a Vertex AI accelerator" in caplog.text
    assert facts.machine_accelerator_errors("g2-standard-8", "NVIDIA_TESLA_X9", 1)  # not a member
    assert not facts.unlisted_vertex_accelerator("NVIDIA_L4")  # listed: judged as before
    assert facts.node_gpu_errors("g2-standard-8", name, 1)  # GKE needs the label
