"""The site's own data files (docs/.data/): their schemas, and loading that names the line of a mistake.

Only the site build reads these files, so they are validated with pydantic
(the labs, which run where pydantic is not installed, use dataclasses over the
same reader). Parsing goes through `labs.datafile`, shared with the labs and the
question bank: duplicate keys are refused and every YAML error is caught. A
problem reads `docs/.data/modules.yaml:12: field 'modules[2].bank': Input
should be a valid boolean`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `python docs/.hooks/bank.py check` runs without the project on the path
    sys.path.insert(0, str(ROOT))

from labs import datafile  # noqa: E402

MODULES_FILE = "docs/.data/modules.yaml"
GLOSSARY_FILE = "docs/.data/glossary.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, str_strip_whitespace=True)


class ModuleEntry(_Strict):
    part: int = Field(ge=0, le=8)
    name: str = Field(min_length=1, max_length=80)
    scope: str = Field(min_length=1)
    bank: bool = True


class ModulesFile(_Strict):
    modules: list[ModuleEntry] = Field(min_length=1)

    @field_validator("modules")
    @classmethod
    def _parts_in_order(cls, value: list[ModuleEntry]) -> list[ModuleEntry]:
        parts = [m.part for m in value]
        if parts != list(range(len(parts))):
            raise ValueError(f"parts must be 0, 1, 2, ... in order, got {parts}")
        return value


class NotationEntry(_Strict):
    symbol: str = Field(min_length=1)
    meaning: str = Field(min_length=1)


class Term(_Strict):
    term: str = Field(min_length=1, max_length=40, pattern=r"^[^\[\]\n]+$")
    expansion: str = Field(min_length=1, pattern=r"^[^\n]+$")  # one line: it becomes an abbr tooltip
    definition: str = Field(min_length=1)
    abbreviation: bool = True


class GlossaryFile(_Strict):
    intro: str = Field(min_length=1)
    notation: list[NotationEntry]
    terms: list[Term] = Field(min_length=1)

    @field_validator("terms")
    @classmethod
    def _unique_terms(cls, value: list[Term]) -> list[Term]:
        seen: set[str] = set()
        for t in value:
            if t.term.lower() in seen:
                raise ValueError(f"term {t.term!r} is defined twice")
            seen.add(t.term.lower())
        return value


def problems_of(doc: datafile.Document, err: ValidationError) -> list[datafile.DataError]:
    """pydantic's errors as `file:line: field: message`, at the line of the field in the YAML."""
    out = []
    # An unknown key first: a typo'd field also shows up as the real one missing.
    for e in sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden"):
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        message = e["msg"]
        if e["type"] == "extra_forbidden":
            message = "unknown field"
        out.append(doc.error(loc, message))
    return out


def validate(model: type[BaseModel], path: Path, shown: str) -> tuple[BaseModel, datafile.Document]:
    """Load `path` and validate it as `model`; a DataError naming the first problem's line and field."""
    doc = datafile.load(path, shown)
    try:
        return model.model_validate(doc.data if doc.data is not None else {}), doc
    except ValidationError as err:
        problems = problems_of(doc, err)
        first = problems[0]
        if len(problems) > 1:
            first = datafile.DataError(first.file, first.line, first.field,
                                       f"{first.message} (and {len(problems) - 1} more: "
                                       + "; ".join(str(p) for p in problems[1:4]) + ")")
        raise first from None


def load_modules(root: Path) -> ModulesFile:
    return validate(ModulesFile, Path(root) / MODULES_FILE, MODULES_FILE)[0]  # type: ignore[return-value]


def load_glossary(root: Path) -> GlossaryFile:
    return validate(GlossaryFile, Path(root) / GLOSSARY_FILE, GLOSSARY_FILE)[0]  # type: ignore[return-value]
