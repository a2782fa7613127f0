"""Print the project's Python dependencies (plus an extra's) from pyproject.toml.

Used by the Makefile so the dependency list lives in one place.
"""

import sys
import tomllib
from pathlib import Path

project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
deps = list(project["dependencies"])
extras = project.get("optional-dependencies", {})
todo = list(sys.argv[1:])
while todo:
    extra = todo.pop()
    for dep in extras.get(extra, []):
        if dep.startswith("statestore["):
            todo.extend(dep[len("statestore[") : -1].split(","))
        else:
            deps.append(dep)
print(" ".join(deps))
