"""The policy table: complete, rendered in docs/policy.md, and obeyed by the state manager."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from statestore import OffsetCheckpoint, TaskId, TopicPartition
from statestore.state.directory import StateDirectory
from statestore.state.policy import (
    POLICY_TABLE,
    Event,
    Guarantee,
    OffsetAction,
    OffsetsMode,
    Policy,
    render_markdown,
)
from statestore.state.state_manager import StateManager
from statestore.state.store import Store
from support import ROOT

DOC = ROOT / "docs" / "policy.md"
TASK = TaskId(2, 0)
P = TopicPartition("app-s-changelog", 0)
ALL = [(g, m) for g in Guarantee for m in OffsetsMode]


def test_table_covers_every_event_guarantee_and_mode_exactly_once() -> None:
    keys = {(e, g, m) for e in Event for g in Guarantee for m in OffsetsMode}
    assert set(POLICY_TABLE) == keys
    assert all(d.why for d in POLICY_TABLE.values())


def test_doc_is_the_rendered_table() -> None:
    """docs/policy.md must be regenerated (`python -m statestore.state.policy > docs/policy.md`) when the table changes."""
    assert DOC.read_text("utf-8") == render_markdown()


def test_doc_mentions_every_row() -> None:
    text = render_markdown()
    for (event, guarantee, _), decision in POLICY_TABLE.items():
        assert f"| {event.value} | {guarantee.value} | {decision.offsets.value}" in text


def test_exactly_once_checkpoint_rows_are_kafkas_with_kafka_20685_fixed() -> None:
    eos = Policy.of("exactly_once_v2", "checkpoint")
    init = eos.decide(Event.INIT)
    assert init.offsets is OffsetAction.LOAD_DELETE and init.corrupt_if_missing
    assert eos.decide(Event.RESTORE_COMPLETE).offsets is OffsetAction.DELETE
    commit = eos.decide(Event.COMMIT)
    assert commit.offsets is OffsetAction.KEEP and not commit.flush
    for event in (Event.SUSPEND, Event.CLOSE_CLEAN):
        d = eos.decide(event)
        assert d.offsets is OffsetAction.WRITE and d.flush
    assert eos.decide(Event.RESUME).offsets is OffsetAction.DELETE
    assert eos.decide(Event.CLOSE_DIRTY).wipe
    # a crash at any point while the task can process wipes
    for event in (Event.RESTORE_COMPLETE, Event.COMMIT, Event.RESUME):
        assert eos.decide(event).crash_after == "wipe"


def test_at_least_once_checkpoint_rows() -> None:
    alos = Policy.of("at_least_once", "checkpoint")
    assert alos.decide(Event.INIT).offsets is OffsetAction.LOAD
    assert not alos.decide(Event.INIT).corrupt_if_missing
    assert (
        alos.decide(Event.COMMIT).offsets is OffsetAction.WRITE_IF_MOVED and alos.decide(Event.COMMIT).flush
    )
    assert alos.decide(Event.RESTORE_COMPLETE).offsets is OffsetAction.WRITE
    assert not alos.decide(Event.CLOSE_DIRTY).wipe


@pytest.mark.parametrize("guarantee", list(Guarantee))
def test_store_mode_never_wipes_and_commits_offsets_with_data(guarantee: Guarantee) -> None:
    policy = Policy(guarantee, OffsetsMode.STORE)
    for event in Event:
        d = policy.decide(event)
        assert not d.wipe and d.crash_after == "resume" and d.offsets is not OffsetAction.DELETE
    assert policy.decide(Event.COMMIT).offsets is OffsetAction.WRITE


def test_policy_of_parses_names_and_rejects_unknown_ones() -> None:
    assert Policy.of("exactly_once_v2", "checkpoint") == Policy(
        Guarantee.EXACTLY_ONCE_V2, OffsetsMode.CHECKPOINT
    )
    assert Policy() == Policy.of()
    assert Policy().offsets is OffsetsMode.STORE
    with pytest.raises(ValueError):
        Policy.of("exactly_once")
    with pytest.raises(ValueError):
        Policy.of(offsets="file")
    with pytest.raises(ValueError):
        Policy.of(checkpoint_delta=-1)


def test_threshold_rule() -> None:
    """Items 42 and 46: 10 -> 12000 writes, 10 -> 20 does not; nothing recorded yet means not initialized."""
    policy = Policy.of("at_least_once", "checkpoint")
    moved = policy.decide(Event.COMMIT)
    assert policy.should_write(moved, {P: 10}, {P: 12_000})
    assert not policy.should_write(moved, {P: 10}, {P: 20})
    assert policy.should_write(moved, {}, {P: 10_001})  # a new partition counts from 0
    assert not policy.should_write(moved, {}, {P: 10_000})
    assert not policy.should_write(moved, None, {P: 10**9})
    assert Policy.of(checkpoint_delta=5).should_write(moved, {P: 0}, {P: 6})
    assert not policy.should_write(policy.decide(Event.INIT), {}, {P: 10**9})


# -- the state manager obeys the table -------------------------------------------------


@pytest.fixture
def sd(tmp_path: Path) -> Iterator[StateDirectory]:
    d = StateDirectory(tmp_path, "app")
    yield d
    d.close()


def running(sd: StateDirectory, policy: Policy, *, standby: bool = False) -> StateManager:
    sm = StateManager(sd, TASK, policy, standby=standby)
    sm.register("s")
    sm.initialize()
    return sm


EVENTS: dict[Event, Callable[[StateManager], object]] = {
    Event.RESTORE_PROGRESS: lambda sm: sm.restoration_progress({P: 500}),
    Event.RESTORE_COMPLETE: lambda sm: sm.complete_restoration({P: 500}),
    Event.COMMIT: lambda sm: sm.commit({P: 500}),
    Event.STANDBY_COMMIT: lambda sm: sm.commit({P: 500}),
    Event.SUSPEND: lambda sm: (sm.update_offsets({P: 500}), sm.suspend()),
    Event.RESUME: lambda sm: (sm.update_offsets({P: 500}), sm.resume()),
    Event.CLOSE_CLEAN: lambda sm: (sm.update_offsets({P: 500}), sm.close()),
    Event.CLOSE_DIRTY: lambda sm: (sm.update_offsets({P: 500}), sm.close(clean=False)),
}


@pytest.mark.parametrize("event", list(EVENTS), ids=lambda e: e.value)
@pytest.mark.parametrize("guarantee", list(Guarantee), ids=lambda g: g.value)
def test_checkpoint_file_follows_the_table(sd: StateDirectory, guarantee: Guarantee, event: Event) -> None:
    """Before the event the file holds a stale {P: 1}; afterwards it is what the table says."""
    policy = Policy(guarantee, OffsetsMode.CHECKPOINT, checkpoint_delta=100)
    sm = running(sd, policy, standby=event is Event.STANDBY_COMMIT)
    sm.store("s").put(b"k", b"v")
    sm.commit()  # the data exists (offsets unchanged)
    ckpt = OffsetCheckpoint(sd.checkpoint_path(TASK))
    ckpt.write({P: 1})
    EVENTS[event](sm)
    decision = policy.decide(event)
    if decision.wipe:
        assert sd.is_empty(TASK) and not ckpt.exists()
    elif decision.offsets in (OffsetAction.WRITE, OffsetAction.WRITE_IF_MOVED):
        assert ckpt.read() == {P: 500}
    elif decision.offsets is OffsetAction.DELETE:
        assert not ckpt.exists()
    else:
        assert decision.offsets is OffsetAction.KEEP
        assert ckpt.read() == {P: 1}
    sm.close(clean=False)


@pytest.mark.parametrize("event", list(EVENTS), ids=lambda e: e.value)
@pytest.mark.parametrize("guarantee", list(Guarantee), ids=lambda g: g.value)
def test_store_offsets_follow_the_table(sd: StateDirectory, guarantee: Guarantee, event: Event) -> None:
    policy = Policy(guarantee, OffsetsMode.STORE)
    sm = running(sd, policy, standby=event is Event.STANDBY_COMMIT)
    sm.store("s").put(b"k", b"v")
    sm.commit({P: 1})
    EVENTS[event](sm)
    sm.close(clean=False)
    with Store(sd.store_dir(TASK, "s")) as s:
        recorded = s.offset(P)
        assert s.get(b"k") == b"v"
    if policy.decide(event).offsets is OffsetAction.WRITE:
        assert recorded == 500
    else:
        assert recorded == 1
    assert not sd.checkpoint_path(TASK).exists()


def test_alos_commit_checkpoints_only_when_offsets_moved_enough(sd: StateDirectory) -> None:
    """Item 42: with the default threshold, 10 -> 20 writes nothing, 10 -> 12000 writes."""
    sm = running(sd, Policy.of("at_least_once", "checkpoint"))
    ckpt = OffsetCheckpoint(sd.checkpoint_path(TASK))
    sm.complete_restoration({P: 10})  # item 40: ALOS checkpoints after restoration
    assert ckpt.read() == {P: 10}
    assert sm.commit({P: 20}) is False and ckpt.read() == {P: 10}
    assert sm.commit({P: 12_000}) is True and ckpt.read() == {P: 12_000}
    assert sm.commit({P: 12_001}) is False
    sm.close()
    assert ckpt.read() == {P: 12_001}


def test_standby_checkpoints_on_big_advance_under_eos(sd: StateDirectory) -> None:
    """Item 46: a standby checkpoints 50 -> 11000, then not -> 12000; under EOS as well."""
    sm = running(sd, Policy.of("exactly_once_v2", "checkpoint"), standby=True)
    ckpt = OffsetCheckpoint(sd.checkpoint_path(TASK))
    sm.restoration_progress({P: 50})
    assert sm.commit({P: 11_000}) is True and ckpt.read() == {P: 11_000}
    assert sm.commit({P: 12_000}) is False and ckpt.read() == {P: 11_000}
    sm.close(clean=False)


def test_eos_checkpoint_lifecycle(sd: StateDirectory) -> None:
    """Items 40, 41, 43: no file after restoration, none after commits; written on suspend; deleted on resume."""
    sm = running(sd, Policy.of("exactly_once_v2", "checkpoint", checkpoint_delta=0))
    ckpt = OffsetCheckpoint(sd.checkpoint_path(TASK))
    sm.restoration_progress({P: 5})
    assert ckpt.read() == {P: 5}  # restored data is committed data
    sm.complete_restoration({P: 9})
    assert not ckpt.exists()
    for off in (100, 20_000, 40_000):
        sm.store("s").put(b"k", str(off).encode())
        sm.commit({P: off})
        assert not ckpt.exists()
    sm.suspend()
    assert ckpt.read() == {P: 40_000}
    sm.resume()
    assert not ckpt.exists()
    sm.close()
    assert ckpt.read() == {P: 40_000}
