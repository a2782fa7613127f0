"""Write the seed corpora of the Python fuzz targets to ``fuzz/corpus/py_<target>/``.

python fuzz/python/make_seeds.py
"""

from __future__ import annotations

import json
from pathlib import Path

CORPUS = Path(__file__).resolve().parent.parent / "corpus"


def _entry(key: bytes, value: bytes) -> bytes:
    """An ``offsets_entry`` input: key length, key, value."""
    return bytes([len(key)]) + key + value


SEEDS: dict[str, dict[str, bytes]] = {
    "checkpoint": {
        "two": b"0\n2\ntopic 0 41\napp-store-changelog 3 -4\n",
        "empty-map": b"0\n0\n",
        "crlf": b"0\r\n1\r\nt 2 0\r\n",
        "skipped-negative": b"0\n1\nt 0 -1\nu 1 7\n",
        "leading-zeros": b"0\n1\nt 0 0000000000000000000000007\n",
        "bad-count": b"0\n3\nt 0 1\n",
        "bad-version": b"1\n0\n",
    },
    "process_metadata": {
        "process": json.dumps({"processId": "0b0bd54b-3c1f-4cd2-8d89-e5b5e24c1a0e"}).encode(),
        "holder": (json.dumps({"pid": 4242, "host": "node-1"}) + "\n").encode(),
        "nested": b"[[[{}]]]",
    },
    "offsets_entry": {
        "offset": _entry(b"app-store-changelog-3", (41).to_bytes(8, "big", signed=True)),
        "status": _entry(b"status", (1).to_bytes(8, "big", signed=True)),
        "short-value": _entry(b"t-0", b"xyz"),
    },
    "task_dir_name": {"task": b"0_3", "big": b"12_305", "other": b"rocksdb"},
}


def main() -> None:
    for target, seeds in SEEDS.items():
        d = CORPUS / f"py_{target}"
        d.mkdir(parents=True, exist_ok=True)
        for name, data in seeds.items():
            (d / f"seed-{name}").write_bytes(data)


if __name__ == "__main__":
    main()
