"""When a ps/worker server gives up on its chief (pure timing rule)."""

from tfdist.ps.server import CHIEF_GONE_S, CHIEF_START_S, chief_gone


def test_never_seen_chief_counts_as_gone_after_the_start_bound():
    assert not chief_gone(100 + CHIEF_START_S - 0.1, 100, None)
    assert chief_gone(100 + CHIEF_START_S, 100, None)


def test_seen_chief_counts_as_gone_after_it_stops_answering():
    started, seen = 100, 103
    assert not chief_gone(seen + CHIEF_GONE_S - 0.1, started, seen)
    assert chief_gone(seen + CHIEF_GONE_S, started, seen)
    assert CHIEF_GONE_S < CHIEF_START_S  # a chief once up is missed sooner than a slow start


def test_a_pipeline_stage_waits_for_a_chief_never_seen_without_end_and_ends_soon_after_it():
    from tfdist.ps.server import STAGE_GONE_S

    assert not chief_gone(10**6, 0, None, start_s=None)  # the chief may start slowly
    assert not chief_gone(50 + STAGE_GONE_S - 0.1, 0, 50, None, STAGE_GONE_S)
    assert chief_gone(50 + STAGE_GONE_S, 0, 50, None, STAGE_GONE_S)
