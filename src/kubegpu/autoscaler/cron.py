"""A five-field cron schedule (UTC), for disruption budgets' `schedule`.

Budgets only ever ask one question — "did the schedule fire within the last `duration`?" — so this is a matcher plus
a minute-by-minute search bounded by that window, not a general cron library.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

_MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}
_NAMES = {
    **{d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])},
    **{m: i + 1 for i, m in enumerate(["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov",
                                       "dec"])},
}
_BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_MAX_SEARCH_MINUTES = 366 * 24 * 60


def _value(text: str, field: int) -> int:
    number = _NAMES.get(text.lower()) if field >= 3 else None
    if number is None:
        if not text.isdigit():
            raise ValueError(f"invalid cron value {text!r}")
        number = int(text)
    low, high = _BOUNDS[field]
    if not low <= number <= high:
        raise ValueError(f"cron value {number} out of range {low}-{high}")
    return number


def _field(text: str, field: int) -> frozenset[int]:
    low, high = _BOUNDS[field]
    values: set[int] = set()
    for part in text.split(","):
        base, _, step_text = part.partition("/")
        step = int(step_text) if step_text.isdigit() and int(step_text) > 0 else None
        if step_text and step is None:
            raise ValueError(f"invalid cron step {part!r}")
        if base == "*":
            start, end = low, high
        elif "-" in base:
            first, last = base.split("-", 1)
            start, end = _value(first, field), _value(last, field)
        else:
            start = _value(base, field)
            end = high if step else start
        values.update(range(start, end + 1, step or 1))
    if field == 4 and 7 in values:
        values = (values - {7}) | {0}
    return frozenset(values)


@dataclass(frozen=True)
class CronSchedule:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    any_day: bool
    any_weekday: bool

    @classmethod
    def parse(cls, text: str) -> CronSchedule:
        spec = _MACROS.get(text.strip().lower(), text)
        parts = spec.split()
        if len(parts) != 5:
            raise ValueError(f"invalid cron schedule {text!r}: want 5 fields or a macro like @daily")
        fields = [_field(part, i) for i, part in enumerate(parts)]
        minutes, hours, days, months, weekdays = fields
        return cls(minutes, hours, days, months, weekdays, any_day=parts[2] == "*", any_weekday=parts[4] == "*")

    def matches(self, at: datetime) -> bool:
        if at.minute not in self.minutes or at.hour not in self.hours or at.month not in self.months:
            return False
        day_ok = at.day in self.days
        weekday_ok = (at.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:  # standard cron: both restricted means either may match
            return day_ok and weekday_ok
        return day_ok or weekday_ok

    def next_after(self, start: datetime, limit_minutes: int = _MAX_SEARCH_MINUTES) -> datetime | None:
        """The first firing strictly after `start` (to the minute), or None within `limit_minutes`."""
        at = start.replace(second=0, microsecond=0) + timedelta(minutes=1)
        for _ in range(limit_minutes):
            if self.matches(at):
                return at
            at += timedelta(minutes=1)
        return None
