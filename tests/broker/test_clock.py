"""The broker clock follows the monotonic clock after start, not wall-clock steps."""

from delayd.broker.clock import Clock


def test_wall_steps_after_start_are_ignored_and_reported():
    mono = [50.0]
    step = [0.0]  # how far the wall clock was set away from true time

    def wall() -> float:
        return 1_000_000.0 + (mono[0] - 50.0) * 1000 + step[0]

    c = Clock(wall_ms=wall, monotonic_s=lambda: mono[0])
    assert c.now_ms() == 1_000_000
    mono[0] += 1.5
    assert c.now_ms() == 1_001_500 and c.wall_skew_ms() == 0
    step[0] = -3_600_000  # the wall clock is set back an hour
    assert c.now_ms() == 1_001_500, "no time travel: the broker keeps counting"
    assert c.wall_skew_ms() == -3_600_000
    step[0] = 7_200_000  # then two hours forward
    mono[0] += 0.25
    assert c.now_ms() == 1_001_750, "and no jump ahead either"
    assert c.wall_skew_ms() == 7_200_000
