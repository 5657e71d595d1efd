"""Other processes' share of the CPU: our own work (this process and every process it started,
running or ended) is never counted as theirs."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from advisor.measure.machine_load import BUSY_SHARE, CpuUsage, busy_warning, own_cpu_s


class Counter:
    """Readers whose values the test sets: exact shares."""

    def __init__(self) -> None:
        self.busy, self.own, self.now = 100.0, 10.0, 0.0


def test_the_share_is_what_others_used_of_every_cpu() -> None:
    c = Counter()
    usage = CpuUsage(busy=lambda: c.busy, own=lambda: c.own, clock=lambda: c.now, cpus=2)
    c.now += 10.0  # 20 CPU seconds available
    c.busy += 14.0  # the kernel counted 14 busy CPU seconds ...
    c.own += 9.0  # ... 9 of them ours
    assert usage.others_share() == pytest.approx(5.0 / 20.0)
    c.busy += 100.0  # more than the machine has: at most all of it
    assert usage.others_share() == 1.0
    assert CpuUsage(busy=lambda: None, own=lambda: 0.0).others_share() is None  # no /proc/stat


def test_the_warning_names_the_share_above_the_threshold() -> None:
    assert busy_warning(None) is None and busy_warning(BUSY_SHARE) is None
    warning = busy_warning(0.45)
    assert warning is not None and "45%" in warning and "quiet" in warning


def test_a_running_child_and_an_ended_one_are_our_own_cpu_time() -> None:
    before = own_cpu_s()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    assert own_cpu_s() - before >= 0.45  # ended and waited for: RUSAGE_CHILDREN
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        base, deadline = own_cpu_s(), time.monotonic() + 60
        # still running: read from /proc, however slowly a busy machine lets it run
        while own_cpu_s() - base < 0.3:
            assert spin.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        spin.kill()
        spin.wait()
