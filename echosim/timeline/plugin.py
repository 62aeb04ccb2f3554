"""The built-in pipeline schedules register through the same hook a plugin's schedule uses."""

from __future__ import annotations

from echosim.plugins import hookimpl
from echosim.plugins.hookspecs import RegisterSchedule


@hookimpl
def register_schedules(register: RegisterSchedule) -> None:
    from echosim.timeline.schedule import BUILTIN_SCHEDULES

    for schedule in BUILTIN_SCHEDULES:
        register(schedule.name, schedule)
