"""The package as a newcomer meets it: layered groups, a public API that says what it is, old names kept working.

The import graph is read from the source (``support.import_graph``): a module
imports only from its own group or a group below it, and no modules import
each other in a cycle, so the folder a change belongs in is the folder its
imports allow.
"""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path

import pytest

import statestore
from statestore import SegmentLog, TopicPartition, restore_store, store_lag
from support.import_graph import LAYERS, cycles, imports, layer, modules


def test_every_module_belongs_to_a_layer() -> None:
    for name in modules():
        layer(name)  # LookupError names a module no layer covers


def test_no_module_imports_from_a_group_above_its_own() -> None:
    upward = [
        f"{e.importer} (line {e.line}) imports {e.imported}: "
        f"layer {LAYERS[layer(e.importer)][0]} is below {LAYERS[layer(e.imported)][0]}"
        for e in imports()
        if layer(e.imported) > layer(e.importer)
    ]
    assert not upward, "\n".join(upward)


def test_the_import_graph_has_no_cycles() -> None:
    assert cycles(imports()) == []


def test_the_graph_sees_imports_made_inside_functions_and_for_type_checking() -> None:
    edges = imports()
    assert any(not e.eager for e in edges), "lazy imports exist in the package and must be seen"
    assert any(
        e.importer == "statestore.changelog.segment_log" and e.imported == "statestore._native" for e in edges
    )


def test_public_names_are_importable_and_internals_are_not_exported() -> None:
    for name in statestore.__all__:
        assert getattr(statestore, name) is not None, name
    for internal in ("StateManager", "StateDirectory", "TaskLock"):
        assert internal not in statestore.__all__
    for module, names in {
        "statestore.kafka": ["KafkaChangelog", "KafkaProducer", "ensure_changelog_topics"],
        "statestore.spark": ["restore_on_spark", "spark_session"],
        "statestore.metrics_prometheus": ["start_exporter", "register"],
    }.items():
        m = importlib.import_module(module)
        for name in names:
            assert name in m.__all__ and getattr(m, name) is not None, (module, name)


def test_internals_once_exported_still_resolve_with_a_warning_naming_their_module() -> None:
    with pytest.warns(DeprecationWarning, match=r"statestore\.state\.state_manager"):
        cls = statestore.StateManager
    from statestore.state.state_manager import StateManager

    assert cls is StateManager
    with pytest.raises(AttributeError):
        _ = statestore.NoSuchThing


def _log(tmp_path: Path) -> SegmentLog:
    log = SegmentLog(tmp_path / "log")
    with log.producer("w") as p:
        p.begin()
        p.send("app-s-changelog", 0, b"k", b"v")
        p.commit()
    return log


def test_changelog_is_the_keyword_and_log_still_works_with_a_deprecation_warning(tmp_path: Path) -> None:
    log = _log(tmp_path)
    tp = TopicPartition("app-s-changelog", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert restore_store(tmp_path / "a", changelog=log, tp=tp).records_applied == 1
        assert store_lag(changelog=log, tp=tp, offset=None).records == 1
        spec = statestore.RestoreSpec(tmp_path / "b", changelog=log, tp=tp)
    with pytest.warns(DeprecationWarning, match="'log' is deprecated, use 'changelog'"):
        assert restore_store(tmp_path / "c", log=log, tp=tp).records_applied == 1
    with pytest.warns(DeprecationWarning):
        old = statestore.RestoreSpec(tmp_path / "d", log=log, tp=tp)
    assert old.changelog is log and spec.changelog is log
    with pytest.warns(DeprecationWarning):
        assert store_lag(log=log, tp=tp, offset=0).records == 0
    [r] = statestore.restore_many([old])
    assert r.ok and r.records_applied == 1
    with pytest.raises(TypeError, match="once"), pytest.warns(DeprecationWarning):
        restore_store(tmp_path / "e", log, tp, log=log)
    with pytest.raises(TypeError, match="missing the changelog"):
        restore_store(tmp_path / "f", tp=tp)
