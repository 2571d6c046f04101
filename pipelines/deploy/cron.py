"""Cron expressions for scheduled fine-tunes, checked once and translated per backend.

Users write one syntax, Vertex AI's: five fields (minute hour day-of-month month day-of-week),
optionally prefixed with `CRON_TZ=<IANA zone>` (or `TZ=`), or a macro such as `@weekly`.
KFP recurring runs take six fields with seconds first (robfig/cron), so `to_kfp` prepends `0`
and tells the caller it did. KFP has no per-schedule time zone (the scheduled-workflow controller
applies its own, UTC unless configured), so a non-UTC `CRON_TZ` is refused for KFP rather than
silently shifted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
"""Macros accepted on input, expanded to five fields so both backends get the same times."""

_MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_MONTHS = {m: i + 1 for i, m in enumerate(_MONTH_NAMES)}
_DAYS = {d: i for i, d in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}
# (name, low, high, names) per field; day-of-week 7 is Sunday as in Vixie cron.
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day-of-month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day-of-week", 0, 7, _DAYS),
)
_TZ_PREFIX = re.compile(r"^(?:CRON_TZ|TZ)=(\S+)\s+(.*)$")
_UTC_NAMES = {"UTC", "Etc/UTC", "GMT", "Etc/GMT", "Z"}


@dataclass(frozen=True)
class Cron:
    """A validated five-field cron expression and its optional time zone."""

    fields: tuple[str, str, str, str, str]
    """minute, hour, day-of-month, month, day-of-week, as written (macros expanded)."""
    time_zone: str | None = None
    """IANA zone from a `CRON_TZ=`/`TZ=` prefix; None means UTC."""

    def to_vertex(self) -> str:
        """The expression for `PipelineJobSchedule` (`CRON_TZ=` prefix kept)."""
        expr = " ".join(self.fields)
        return f"CRON_TZ={self.time_zone} {expr}" if self.time_zone else expr

    def to_kfp(self) -> str:
        """Six fields for a KFP recurring run: seconds `0` first, day-of-week 7 written as 0.

        Raises:
            ValueError: the expression names a time zone other than UTC.
        """
        if self.time_zone and self.time_zone not in _UTC_NAMES:
            raise ValueError(
                f"KFP recurring runs have no per-schedule time zone (CRON_TZ={self.time_zone}): "
                "write the cron in UTC, or set CRON_SCHEDULE_TIMEZONE on KFP's "
                "scheduledworkflow controller and drop the CRON_TZ= prefix"
            )
        return " ".join(("0", *self.fields[:4], _kfp_day_of_week(self.fields[4])))


def _kfp_day_of_week(text: str) -> str:
    """robfig/cron takes day-of-week 0-6: rewrite Sunday-as-7 (`7`, `5-7`) without changing days."""
    items = []
    for item in text.split(","):
        base, sep, _step = item.partition("/")
        low, dash, high = base.partition("-")
        if base == "7":
            items.append("0")
        elif dash and high == "7" and not sep:
            items.extend([f"{low}-6" if low != "6" else "6", "0"] if low != "7" else ["0"])
        elif "7" in (low, high):
            raise ValueError(
                f"day-of-week {item!r}: KFP counts Sunday only as 0; write the range within 0-6"
            )
        else:
            items.append(item)
    return ",".join(items)


def _check_field(text: str, name: str, low: int, high: int, names: dict[str, int]) -> list[str]:
    errors = []
    for item in text.split(","):
        base, _, step = item.partition("/")
        if step and (not step.isdigit() or int(step) == 0):
            errors.append(f"{name} step {step!r} in {item!r} must be a positive integer")
        if base in ("*", "?"):
            if base == "?" and name not in ("day-of-month", "day-of-week"):
                errors.append(f"{name} cannot be '?'")
            continue
        bounds = base.split("-")
        if len(bounds) > 2 or not all(bounds):
            errors.append(f"{name} {item!r} is not N, N-M, */S or N-M/S")
            continue
        values = []
        for bound in bounds:
            upper = bound.upper()
            if upper in names:
                values.append(names[upper])
            elif bound.isdigit():
                values.append(int(bound))
            else:
                errors.append(
                    f"{name} value {bound!r} is not a number"
                    + (f" or one of {'/'.join(names)}" if names else "")
                )
                break
        else:
            bad = [v for v in values if not low <= v <= high]
            if bad:
                errors.append(f"{name} value {bad[0]} is outside {low}-{high}")
            elif len(values) == 2 and values[0] > values[1]:
                errors.append(f"{name} range {base!r} runs backwards")
    return errors


def parse_cron(text: str) -> Cron:
    """Validate a Vertex-style cron (5 fields, optional `CRON_TZ=`/`TZ=` prefix, or a macro).

    Raises:
        ValueError: listing every problem found, with what to write instead.
    """
    text = " ".join(text.split())
    time_zone = None
    match = _TZ_PREFIX.match(text)
    if match:
        time_zone, text = match.group(1), match.group(2)
    errors = []
    if time_zone and time_zone not in _UTC_NAMES:
        try:
            ZoneInfo(time_zone)
        except (ZoneInfoNotFoundError, ValueError):
            errors.append(f"unknown time zone {time_zone!r} (use an IANA name, e.g. Europe/Berlin)")
    text = MACROS.get(text.lower(), text)
    parts = text.split(" ")
    if len(parts) != 5:
        hint = (
            " (six fields look like KFP's seconds-first syntax: drop the seconds, llmft adds them "
            "for KFP)"
            if len(parts) == 6
            else ""
        )
        raise ValueError(
            f"cron {text!r} has {len(parts)} fields; write 5: minute hour day-of-month month "
            f"day-of-week, e.g. 'CRON_TZ=Europe/Berlin 0 3 * * 1'{hint}"
        )
    for part, (name, low, high, names) in zip(parts, _FIELDS, strict=True):
        errors.extend(_check_field(part, name, low, high, names))
    if errors:
        raise ValueError(f"cron {text!r}: " + "; ".join(errors))
    return Cron(fields=(parts[0], parts[1], parts[2], parts[3], parts[4]), time_zone=time_zone)
