"""Build the training model: resolve where the weights are, wrap for data parallelism, then load.

Initialisation never materialises the full model on every rank from disk: every rank builds the
module tree with parameters on the meta device (buffers such as RoPE frequencies are real, they
are tiny), wraps it for data parallelism, allocates its parameters, and then rank 0 alone loads
the checkpoint with `from_pretrained` and broadcasts it (`set_model_state_dict(...,
broadcast_from_rank0=True)`).

Two data-parallel layouts, picked by `data_parallel` ("auto": by model size, `replicate_max_params`):

- "shard": FSDP2 `fully_shard` per decoder block (unless shard_blocks=false) and at the root.
  Parameters are DTensors; each process allocates 1/world of the model, so host memory per node
  is one full copy (rank 0's load) plus 1/world per process.
- "replicate": DDP (torch.distributed's composable `replicate`, DistributedDataParallel's reducer
  applied in place, so the module tree and its state-dict keys stay those of `CausalLMLoss`).
  Parameters are plain tensors, every process holds a whole copy, and gradients are all-reduced
  in buckets that are views of the gradients, overlapped with backward. For small models that
  is cheaper than FSDP2's per-step flat-buffer copies (docs/performance.md).

The checkpoint (DCP), export and LoRA paths take either: torch.distributed.checkpoint.state_dict
maps both to the same fully qualified names.

The loss is computed inside the root module (`CausalLMLoss`): the LM head runs only on
positions whose next token is a target. Prompt tokens and padding never reach the vocabulary
projection, which for instruction data and small models is a large share of the FLOPs. For
the families trainer/last_block.py lists, the last block's MLP skips them too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer import attention, last_block, rms_norm, storage
from trainer.config import TrainConfig
from trainer.gguf import is_gguf, resolve_gguf
from trainer.memory_model import replicates
from trainer.meta_init import parameters_on_meta
from trainer.preference import dpo_stats, sum_by_pair
from trainer.quantize import quantize_blocks, quantized_modules

log = logging.getLogger(__name__)


def resolve_model_dir(spec: str, *, local_rank: int) -> str:
    """A local directory holding `spec` (a local dir, a gs:// or other remote URI, a Hub id).

    Remote models are copied once per node into the node's cache (`storage.cached_copy`: a file
    lock makes the other ranks of the node wait for the one download). A `.gguf` file is
    converted once per machine into a plain directory (trainer/gguf.py).
    """
    if is_gguf(spec):
        return resolve_gguf(spec)

    if storage.is_remote(spec):
        return storage.cached_copy(spec)
    spec = storage.local_path(spec)
    if Path(spec).is_dir():
        return spec
    if Path(spec).exists() or spec.startswith(("/", "./", "../")):
        raise ValueError(f"model {spec!r} is not a directory: pass a Hugging Face model directory")
    from huggingface_hub import snapshot_download

    if local_rank == 0:
        snapshot_download(spec)
    _barrier()
    return snapshot_download(spec, local_files_only=True)


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def decoder_blocks(model: nn.Module, num_layers: int) -> nn.ModuleList:
    """The ModuleList of transformer blocks (model.model.layers for Llama-like models)."""
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == num_layers:
            return module
    raise ValueError(f"cannot find the {num_layers} decoder blocks in {type(model).__name__}")


class CausalLMLoss(nn.Module):
    """The FSDP root: decoder forward + LM head on target positions only + summed cross-entropy.

    Called with `position_ids` and without an attention mask or KV cache: that is what makes
    transformers 5 restrict attention to each packed document (docs/architecture.md).
    """

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm
        self.replicated = False
        """Every rank holds whole gradients (data_parallel resolved to replicate: DDP)."""
        self.autocast: torch.dtype | None = None
        """Compute dtype under DDP when it is not fp32 (FSDP2 casts through its policy instead)."""
        self.quantized: list[str] = []
        """State-dict keys of the weights held in NF4 (quantize_base=nf4: trainer/quantize.py)."""
        self.base_source: tuple[TrainConfig, str, torch.dtype] | None = None
        """Quantized only: (config, model directory, compute dtype) the NF4 base was built from,
        so the export can rebuild the de-quantized base exactly."""
        self.dpo_beta = 0.1
        """DPO's beta (`TrainConfig.dpo_beta`), used when a batch carries `pair_ids`."""
        self.last_block_on_targets = True
        """Run the last block's MLP only where a target is predicted, where that is exact
        (trainer/last_block.py); False forces the full decoder (tests compare the two)."""

    def causal_lm(self) -> Any:
        """The Hugging Face *ForCausalLM module (under the peft wrapper when LoRA is on)."""
        lm: Any = self.lm
        return lm.get_base_model() if hasattr(lm, "get_base_model") else lm

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        loss_mask: torch.Tensor | None = None,
        pair_ids: torch.Tensor | None = None,
        task: Callable[[Any], Any] | None = None,
    ) -> Any:
        """Sum over target tokens of -log p(token | its document prefix); with `pair_ids`
        (preference rows), DPO's [loss sum, reward-margin sum, correct-pair count] instead;
        with `task`, `task(self.lm)`'s result (GRPO: a rollout with `generate`, or completion
        log-probabilities and the loss: trainer/grpo_step.py).

        Both passes of DPO run inside this one forward (FSDP2 gathers the root's weights around
        `forward` only): the reference with the LoRA adapters disabled and no autograd, then the
        policy. GRPO's work runs inside it for the same reason.
        """
        if task is not None:
            if self.autocast is None:
                return task(self.lm)
            with torch.autocast(next(self.parameters()).device.type, dtype=self.autocast):
                return task(self.lm)
        assert input_ids is not None and position_ids is not None and loss_mask is not None
        if pair_ids is None:
            return self.token_losses(input_ids, position_ids, loss_mask).sum()

        with torch.no_grad(), self.lm.disable_adapter():  # type: ignore[operator]
            reference = self.pair_logps(input_ids, position_ids, loss_mask, pair_ids)
        policy = self.pair_logps(input_ids, position_ids, loss_mask, pair_ids)
        return dpo_stats(policy, reference, self.dpo_beta)

    def pair_logps(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        loss_mask: torch.Tensor,
        pair_ids: torch.Tensor,
    ) -> torch.Tensor:
        """[pairs, 2]: log p(chosen response | prompt), log p(rejected | prompt) of every pair, in
        row order (summed over each response's target tokens)."""
        logps = -self.token_losses(input_ids, position_ids, loss_mask)
        return sum_by_pair(logps, loss_mask, pair_ids)

    def token_losses(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, loss_mask: torch.Tensor
    ) -> torch.Tensor:
        """-log p(token | its document prefix) of every target token, in row-major order."""
        if self.autocast is None:
            return self._token_losses(input_ids, position_ids, loss_mask)
        with torch.autocast(input_ids.device.type, dtype=self.autocast):
            return self._token_losses(input_ids, position_ids, loss_mask)

    def _token_losses(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, loss_mask: torch.Tensor
    ) -> torch.Tensor:
        causal_lm = self.causal_lm()
        extra: dict[str, Any] = {}
        if causal_lm.config._attn_implementation == attention.NAME:
            extra["document_layout"] = attention.document_layout(position_ids)
        decoder = causal_lm.get_decoder()
        # Position t predicts token t + 1; keep only the positions whose next token is a target.
        select = loss_mask[:, 1:].bool()
        on_targets = self.last_block_on_targets and last_block.last_layer(decoder) is not None
        if on_targets:  # the last block returns those positions only, [1, targets, hidden]
            extra[last_block.ROWS] = last_block.target_rows(loss_mask)
        hidden = decoder(
            input_ids=input_ids, position_ids=position_ids, use_cache=False, **extra
        ).last_hidden_state
        # With layers spread over GPUs, the hidden states and the logits end where the last
        # block and the LM head ran, not on the inputs' device: bring the indices to them.
        hidden = hidden[0] if on_targets else hidden[:, :-1][select.to(hidden.device)]
        logits = head_logits(causal_lm, hidden)
        targets = input_ids[:, 1:][select].to(logits.device)
        return nn.functional.cross_entropy(logits.float(), targets, reduction="none")


class _FinalHidden(nn.Module):
    """Stands in for a model's decoder and returns hidden states computed beforehand."""

    def __init__(self, hidden: torch.Tensor) -> None:
        super().__init__()
        self.output = _DecoderOutput(last_hidden_state=hidden)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.output


class _DecoderOutput(dict):
    """What a *ForCausalLM forward reads from its decoder's output; other fields are None."""

    def __init__(self, last_hidden_state: torch.Tensor) -> None:
        super().__init__(last_hidden_state=last_hidden_state)
        self.last_hidden_state = last_hidden_state

    def __getattr__(self, name: str) -> Any:
        return None

    def __getitem__(self, key: Any) -> Any:
        return self.last_hidden_state if key == 0 else super().__getitem__(key)


def head_logits(causal_lm: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The model's own logits ([N, V]) for final hidden states [N, H].

    Runs the model's forward with its decoder swapped for the precomputed states, so whatever the
    family does between the LM head and the loss applies exactly: Gemma's final-logit
    soft-capping, Granite's `logits_scaling`, Cohere's `logit_scale`, and anything a future family
    adds. Re-implementing those one by one is how they get missed. The head still runs only on
    the N positions that predict a target, which keeps the loss's memory at N x vocab.
    """
    decoder = causal_lm.get_decoder()
    names = [name for name, child in causal_lm.named_children() if child is decoder]
    if len(names) != 1:
        raise ValueError(
            f"cannot find the decoder of {type(causal_lm).__name__} among its children"
        )
    causal_lm._modules[names[0]] = _FinalHidden(hidden.unsqueeze(0))
    try:
        return causal_lm(use_cache=False).logits[0]
    finally:
        causal_lm._modules[names[0]] = decoder


def attn_implementation(config: TrainConfig, hf_config: Any) -> str:
    """transformers' attn_implementation for `config.attention` (ValueError when not exact)."""
    return attention.implementation(config.attention, hf_config)


def _attention_for(config: TrainConfig, hf_config: Any) -> str:
    """The attention a run builds the model with. GRPO generates with padding masks and a KV
    cache, which the packed-row "document" attention does not take: SDPA there (eager where SDPA
    is not exact for the family)."""
    if config.objective != "grpo":
        return attn_implementation(config, hf_config)
    try:
        return attention.implementation("sdpa", hf_config)
    except ValueError:
        return "eager"


def compute_dtype(config: TrainConfig, device: torch.device) -> torch.dtype:
    return dtype_of(config.dtype, device)


def dtype_of(name: str, device: torch.device) -> torch.dtype:
    """A `TrainConfig.dtype` value as a torch dtype on `device` ("auto": bf16 on CUDA, else fp32)."""
    if name == "bf16" or (name == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    """A resolved compute dtype as `TrainConfig.dtype` names it ("bf16" or "fp32")."""
    return "bf16" if dtype == torch.bfloat16 else "fp32"


def compiles(config: TrainConfig, device: torch.device) -> bool:
    """Whether decoder blocks are compiled: `config.compile`, or on GPU only when it is None."""
    return config.compile if config.compile is not None else device.type == "cuda"


def lora_config(config: TrainConfig) -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,  # type: ignore[arg-type]  # peft annotates int, uses float
        lora_dropout=config.lora_dropout,
        target_modules=list(config.lora_target_modules),
        task_type="CAUSAL_LM",
    )


def data_parallel_mesh(device: torch.device) -> Any:
    """The 1-D ("dp_shard",) mesh FSDP2 shards over (the "shard" layout)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp_shard",))


def _load_quantized(
    root: CausalLMLoss,
    blocks: nn.ModuleList,
    config: TrainConfig,
    model_dir: str,
    hf_config: Any,
    device: torch.device,
) -> None:
    """QLoRA: load the base on the CPU into the meta-initialized module (every rank reads it from
    disk; `assign`: the loaded tensors become the parameters, no second copy), quantize the
    blocks' frozen linears to NF4, then move to `device`; wrapping comes after, as torchtune does.

    The base is loaded in the compute dtype: host memory is one copy of the model per process in
    that dtype while loading (bf16 on GPU: 14 GB for a 7B base, not fp32's 28); device memory
    holds only the 4-bit base. NF4 is built from the weights rounded to the compute dtype either
    way (`to_nf4`), so the base is the same as from an fp32 load. Every rank quantizes the same
    weights the same way: nothing is broadcast.
    """
    dtype = compute_dtype(config, device)
    full = load_full_state_dict(config, model_dir, dtype)
    root.load_state_dict(full, strict=True, assign=True)
    del full
    if getattr(hf_config, "tie_word_embeddings", False):
        root.causal_lm().tie_weights()
    root.quantized = quantize_blocks(root, blocks, dtype, device)
    root.base_source = (config, model_dir, dtype)
    root.to(device)


def replicate_ddp(root: CausalLMLoss, device: torch.device) -> None:
    """DDP in place on `root` (parameters may still be on the meta device: DDP starts lazily).

    torch.distributed's composable `replicate` runs DistributedDataParallel's reducer from hooks
    on the module itself, so `root` keeps its class methods, attributes and state-dict keys, and
    it gains `set_requires_gradient_sync` (DDP's no_sync) like an FSDP2 module. The reducer is
    built at the first forward, after the weights are loaded; it broadcasts rank 0's parameters
    then, which the ranks already agree on.

    - gradient_as_bucket_view: gradients are views into the all-reduce buckets, no copies.
    - buffers are not broadcast before each forward (forward_sync_buffers=False): the only buffers
      are RoPE frequencies, computed identically on every rank; that would be a collective per
      forward, and eval forwards would then need the same count on every rank.
    - no static_graph and no find_unused_parameters: every trainable parameter gets a gradient
      every step, so the reducer needs neither.
    """
    import inspect

    from torch.distributed._composable.replicate import replicate

    # torch < 2.13's replicate() has no forward_sync_buffers (it then syncs them, correctly).
    sync = {"forward_sync_buffers": False}
    if "forward_sync_buffers" not in inspect.signature(replicate).parameters:
        sync = {}
    replicate(
        root,
        # Frozen NF4 weights: identical on every rank by construction, never reduced.
        ignored_modules=quantized_modules(root) or None,
        device_id=device,
        gradient_as_bucket_view=True,
        **sync,
    )


def build_model(config: TrainConfig, model_dir: str, device: torch.device) -> CausalLMLoss:
    """Meta init -> (LoRA) -> activation checkpointing -> compile -> FSDP2 or DDP -> load weights."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.from_pretrained(model_dir)
    with parameters_on_meta():
        lm = AutoModelForCausalLM.from_config(
            hf_config,
            dtype=torch.float32,
            attn_implementation=_attention_for(config, hf_config),
        )
        if config.lora_rank:
            from peft import get_peft_model

            lm = get_peft_model(lm, lora_config(config))
    root = CausalLMLoss(lm)
    rms_norm.install(root)  # fp32 eager: one Function, not a dozen element-wise ops
    root.dpo_beta = config.dpo_beta
    root.replicated = replicates(
        config, sum(p.numel() for p in root.parameters()), dist.get_world_size()
    )
    if root.replicated and config.data_parallel == "shard":
        log.warning("data_parallel=shard ignored: an NF4 base on one process replicates")
    blocks = decoder_blocks(root, hf_config.num_hidden_layers)
    if config.quantize_base == "nf4":
        _load_quantized(root, blocks, config, model_dir, hf_config, device)
    if config.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            checkpoint_wrapper,
        )

        for i, block in enumerate(blocks):
            blocks[i] = checkpoint_wrapper(block, preserve_rng_state=False)
    if compiles(config, device) and config.objective != "grpo":
        # GRPO's rollouts call the blocks with a KV cache of a new length every token: compiled
        # blocks would recompile; they run eager.
        # Per block, not the whole model: compile time stays flat in depth and FSDP's hooks stay
        # outside the graphs (the torchtitan recipe). On CPU the last block stays eager where its
        # target-rows path applies (trainer/last_block.py; compiled, it takes the full path, as
        # its row count changes every batch): 1.077x the eager step against 0.97x with it
        # compiled too (docs/performance.md). GPU figures were measured with every block compiled.
        decoder = root.causal_lm().get_decoder()
        eager_last = device.type == "cpu" and last_block.last_layer(decoder) is not None
        for i, block in enumerate(blocks):
            if not (eager_last and i == len(blocks) - 1):
                blocks[i] = torch.compile(block, fullgraph=False)  # type: ignore[assignment]
    if root.replicated:
        dtype = compute_dtype(config, device)
        root.autocast = dtype if dtype != torch.float32 else None
        replicate_ddp(root, device)
    else:
        shard_fsdp(root, blocks, config, device)
    if root.quantized:
        return root  # loaded before wrapping (_load_quantized)

    buffers = {name: b.detach().clone() for name, b in root.named_buffers()}
    root.to_empty(device=device)
    with torch.no_grad():
        for name, buffer in root.named_buffers():
            buffer.copy_(buffers[name].to(device))
    if getattr(hf_config, "tie_word_embeddings", False):
        root.causal_lm().tie_weights()

    full: dict[str, Any] = {}
    if dist.get_rank() == 0:
        full = load_full_state_dict(config, model_dir)
    set_model_state_dict(
        root,
        full,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=True),
    )
    del full
    return root


def shard_fsdp(
    root: CausalLMLoss, blocks: nn.ModuleList, config: TrainConfig, device: torch.device
) -> None:
    """FSDP2 per decoder block (unless shard_blocks=false) and at the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = data_parallel_mesh(device)
    dtype = compute_dtype(config, device)
    mp = MixedPrecisionPolicy(
        param_dtype=dtype if dtype != torch.float32 else None, reduce_dtype=torch.float32
    )
    for block in blocks if config.shard_blocks else []:
        fully_shard(
            block, mesh=mesh, mp_policy=mp, reshard_after_forward=config.reshard_after_forward
        )
    fully_shard(root, mesh=mesh, mp_policy=mp, reshard_after_forward=config.reshard_after_forward)


def load_full_state_dict(
    config: TrainConfig, model_dir: str, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """The full state dict, keyed like `CausalLMLoss`, the base's weights in `dtype` (fp32 but
    for an NF4 base, whose frozen weights are loaded in the compute dtype); LoRA adapters seeded,
    in fp32 (peft keeps adapters fp32 over a bf16 base; their initial values are then rounded to
    bf16 once, as in any peft model on a bf16 base)."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    if config.lora_rank:
        from peft import get_peft_model

        torch.manual_seed(config.seed)
        lm = get_peft_model(lm, lora_config(config))
    return CausalLMLoss(lm).state_dict()


def parameter_counts(root: CausalLMLoss) -> tuple[int, int, int]:
    """(all parameters, trainable ones, parameters in matmuls: all but the input embedding)."""
    total = trainable = 0
    for p in root.parameters():
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    embedding = root.causal_lm().get_input_embeddings().weight.numel()
    return total, trainable, total - embedding
