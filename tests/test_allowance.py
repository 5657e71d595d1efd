"""The first call's allowance: a first call stopped at its allowance, in the main thread by
SIGALRM and off it at a checkpoint, exactly once, and never after it returned in time."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from advisor.allowance import OverAllowance, checkpoint, over_allowance, stop_after


def test_a_cold_compile_is_interrupted_at_its_allowance_and_only_in_it() -> None:
    start = time.perf_counter()
    with pytest.raises(OverAllowance), stop_after(0.05):
        while time.perf_counter() - start < 5:  # a compile in Python: stopped between steps
            pass
    assert time.perf_counter() - start < 1
    start = time.perf_counter()
    with pytest.raises(OverAllowance), stop_after(0.05):
        threading.Event().wait(5)  # a compile waiting on its pool's result: woken and stopped
    assert time.perf_counter() - start < 1
    with stop_after(0.05) as allowance:  # the first call returned in time: no stop after it
        allowance.end()
        time.sleep(0.1)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGALRM)  # a late one
        time.sleep(0.01)
        checkpoint()
    wrapped = RuntimeError("InternalTorchDynamoError")
    wrapped.__cause__ = OverAllowance()
    assert over_allowance(wrapped) and not over_allowance(RuntimeError("other"))
    caught: list[BaseException] = []

    def off_main() -> None:
        try:
            with stop_after(0.01):
                time.sleep(0.05)  # no signal off the main thread: nothing is bounded
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion
            caught.append(e)

    t = threading.Thread(target=off_main)
    t.start()
    t.join()
    assert caught == []


def test_a_stop_the_call_caught_is_raised_again_when_it_returns() -> None:
    # Triton's interpreter reads a kernel's source under `except Exception` (a kernel without
    # source runs unrewritten): a stop landing there is caught, and the call goes on to its end.
    start = time.perf_counter()
    with pytest.raises(OverAllowance), stop_after(0.02) as allowance:
        try:
            while time.perf_counter() - start < 5:
                pass
        except Exception:  # noqa: BLE001 - the caller that swallows it
            pass
        assert time.perf_counter() - start < 1  # stopped, caught, and the call goes on
        time.sleep(0.05)
        allowance.end()  # it returned past its allowance: the stop stands
    with stop_after(0.05) as allowance:  # returned in time: nothing
        allowance.end()


def test_autotuning_off_the_main_thread_stops_at_its_checkpoint_once() -> None:
    # On a GPU autograd runs the backward (two of Triton's three autotunings) on its device
    # thread while the main thread waits in C++ and runs no signal handler: SIGALRM is blocked
    # here to stand for that wait. The device thread meets the stop at its next checkpoint (the
    # autotuner asks before each config); the main thread's late signal then raises nothing.
    met: list[float] = []

    def device_thread() -> None:
        try:
            for _ in range(500):  # configs compiled and timed, 10 ms each
                checkpoint()
                time.sleep(0.01)
        except OverAllowance:
            met.append(time.perf_counter())

    checkpoint()  # no allowance running: nothing
    start = time.perf_counter()
    with stop_after(0.05):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        try:
            t = threading.Thread(target=device_thread)
            t.start()
            t.join()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})  # its handler runs
        time.sleep(0.01)
    assert len(met) == 1 and 0.05 <= met[0] - start < 1
    checkpoint()  # after the allowance: nothing


def test_the_triton_kernels_autotuners_ask_the_checkpoint() -> None:
    pytest.importorskip("triton")
    from advisor.impls.triton_loader import kernels, triton_import_problem

    if triton_import_problem() is not None:
        pytest.skip(triton_import_problem() or "")
    k = kernels()
    for kernel in (k.conv_fwd_kernel, k.conv_dgrad_kernel, k.conv_wgrad_kernel):
        assert kernel.pre_hook is checkpoint


def test_an_allowance_starts_no_thread_and_an_outer_one_still_stops_after_an_inner_one() -> None:
    # The process's timer, not a thread per call: a thread started for each warm-up run slowed
    # the runs it bounded. An allowance within another holds the timer until it ends; the outer
    # one's time then counts again, and an ended one leaves the timer off.
    threads = threading.active_count()
    start = time.perf_counter()
    with pytest.raises(OverAllowance), stop_after(0.3):  # past the inner ones, on a busy machine too
        for _ in range(3):
            with stop_after(1.0, counting=False) as inner:
                assert threading.active_count() == threads
                inner.start()
                time.sleep(0.01)
                inner.end()
            assert signal.getitimer(signal.ITIMER_REAL)[0] > 0  # the outer's, armed again
        while time.perf_counter() - start < 5:
            pass
    assert 0.3 <= time.perf_counter() - start < 1
    with stop_after(0.05) as allowance:
        allowance.end()
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        time.sleep(0.1)  # no signal after the call returned
    assert threading.active_count() == threads
