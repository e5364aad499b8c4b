"""Every vLLM name the content states must be in labs/data/vllm.yaml (no vLLM needed).

The site promises that each vLLM flag, default, metric, endpoint, environment
variable and request field it names exists in vLLM 0.33 with that meaning. The
facts file is checked against vLLM by tests/test_vllm_facts.py; this lint checks
the content against the facts file. It reads docs/**/*.md and
questions/**/*.yaml as raw text, line by line (so every finding names file and
line), and applies these rules:

Commands. A line of a code block, or a code span, whose command (after a `$ `
prompt, `VAR=value` assignments, `sudo`, `uv run`, `docker run ...` up to the
`vllm/vllm-openai` image) starts with `vllm` is a vLLM command; a trailing `\\`
continues it on the next line. In `vllm serve` (and `python -m
vllm.entrypoints.openai.api_server`, and the arguments after a vllm-openai
image) every `-x` / `--flag` must be an engine or server argument of the file
(an alias or a hidden spelling counts; `_` and `-` are the same to vLLM; a
prefix that argparse would expand counts only where the file lists it under
`abbreviations`). In
`vllm bench <command>` the flags must be that command's `bench_args`, plus
engine arguments where the command takes them. Values are checked where the
file lists the allowed names: `--quantization`/`-q`, `--spec-method`, the
`method` of `--speculative-config`, the `backend` of
`--structured-outputs-config`, and `choices` of any flag. Lines that run
`python -m labs...` are the labs' own CLIs and are not vLLM's: no flag on
such a line is checked.

Bare flags. A code span that starts with `--`, or a `--flag` in prose, names a
vLLM flag unless it is one of the labs' own flags (read from the labs' argparse
calls). Another tool's flag is written with its command (`nvidia-smi
--query-gpu=...`), which makes it a command span that is not vLLM's.

Code. Fenced code blocks, and in questions the `code: |` scalars of
snippets, are code: commands, Python calls and JSON bodies are read there.

Python. Keyword arguments of `LLM(...)`, `EngineArgs(...)` and
`AsyncEngineArgs(...)` must be engine arguments; of `SamplingParams(...)`,
SamplingParams request fields; of `client.chat.completions.create(...)` and
`client.completions.create(...)`, request fields (the OpenAI client's own
`extra_body`, `extra_headers`, `timeout` aside), and the keys of an
`extra_body={...}` dict, request fields too.

Request bodies. The top-level keys of a JSON body sent with curl (`-d`,
`--data`, `--data-raw`, `--json`) and of a ```json block that has "messages"
or "prompt" must be request fields. In prose, a code span directly followed by
"field", "request field" or "sampling parameter", or preceded by "field", must
be a request field or an engine argument's Python name.

Metrics, endpoints, variables. Every `vllm:<name>` anywhere must be a metric
of the file (its `_total`, `_bucket`, `_sum`, `_count` forms count). Endpoints:
a path after an HTTP method (`POST /v1/completions`), the path of a
`http://localhost:8000/...`-style URL (loopback, `host:port`, `$HOST` or
`<host>`), a code span that is only a path starting with `/v1/`, `/v2/`,
`/inference/` or of one segment (`/health`; `/tmp`-style filesystem roots
aside), and `/v1/...` paths in prose; `/v1`, `/v2`, `/inference` and `/cohere`
alone name the API key's prefixes (`api_key_prefixes`). Every `VLLM_<NAME>` anywhere must be an
environment variable of the file.

Defaults. A sentence that names a flag or an engine argument's Python name
and then says it "defaults to" / "default is" / "(default X)" a literal value
must agree with the file (the raw default, the value used when it is not
given, or, for GPU-dependent batch defaults, any value of the table). Pages
should render defaults with `{{ default(...) }}`; this catches the typed ones.

Macros. The names in `flag()`, `default()`, `metric()`, `endpoint()`,
`env_var()`, `request_field()`, `vllm_name()` and `removed()` calls must be in
the file (the build fails on them too; the lint names the line first).

Removed names. A name in the file's `removed` section is an error anywhere
except inside a `removed("...")` macro call, which renders it struck through
with the version that dropped it.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT

from labs import vllm_facts

# ---------------------------------------------------------------------------
# Data: what counts as what
# ---------------------------------------------------------------------------

CONTENT_GLOBS = ("docs/**/*.md", "questions/**/*.yaml")

FENCE_RE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
SPAN_RE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
MACRO_RE = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.DOTALL)
MACRO_CALL_RE = re.compile(
    r"\b(flag|default|metric|endpoint|env_var|request_field|vllm_name|removed|batch_default)\(\s*"
    r"(['\"])([^'\"]+)\2(?:\s*,\s*(['\"])([^'\"]+)\4)?"
)
METRIC_RE = re.compile(r"(?<![\w/-])vllm:[A-Za-z_][A-Za-z0-9_:]*\*?")
ENV_RE = re.compile(r"(?<![A-Za-z0-9_])VLLM_(?:[A-Z0-9_]*\*|[A-Z0-9_]*[A-Z0-9])")
PROSE_FLAG_RE = re.compile(r"(?<![\w/`-])--[a-z][a-z0-9_]*(?:-[a-z0-9_]+)*")
CMD_FLAG_RE = re.compile(r"(?<![\w/])(--?[A-Za-z][\w-]*)(?:=(\S+))?")
HTTP_METHOD_PATH_RE = re.compile(r"\b(GET|POST|PUT|DELETE|PATCH)\s+(/[\w/{}.-]*)")
URL_RE = re.compile(r"https?://(localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1\]|\$\{?\w+\}?|<[\w-]+>|[\w.-]+:\d+)"
                    r"(?::\d+|:\$\{?\w+\}?)?(/[\w/{}.-]*)?")
API_PATH_RE = re.compile(r"(?<![\w.:/-])/(?:v1|v2|inference)/[\w/{}.-]*[\w}]")
PATH_SPAN_RE = re.compile(r"^/(?:[\w.{}-]+/?)+$")
FILESYSTEM_ROOTS = {"tmp", "dev", "proc", "sys", "etc", "usr", "home", "var", "opt", "root", "mnt", "bin", "lib",
                    "data", "workspace", "models", "out", "srv", "run", "s", "sec", "ms"}
REQUEST_SPAN_RE = [
    re.compile(r"`(\w+)`\s+(?:request\s+)?(?:field|sampling parameter)\b"),
    re.compile(r"\b(?:request\s+)?field\s+`(\w+)`"),
]
DEFAULT_CLAIM_RE = re.compile(
    r"^[^.;!?\n]{0,80}?\b(?:defaults?\s+(?:to|is|of|=|:)?|\(default\s*(?:is|:|=)?)\s*"
    r"(`[^`]+`|-?\d[\d,_]*(?:\.\d+)?(?![\w.]*\w)|(?:true|false|none|null|on|off)\b)",
    re.IGNORECASE,
)
LABS_COMMAND_RE = re.compile(r"\bpython3? -m labs\b")
YAML_CODE_RE = re.compile(r"^(\s*)(?:- )?code:\s*[|>][-+]?\s*$")
YAML_LANGUAGE_RE = re.compile(r"^\s*(?:- )?language:\s*(\w+)")
OPENAI_CLIENT_KWARGS = {"extra_body", "extra_headers", "extra_query", "timeout"}
REQUEST_CALLS = {
    "SamplingParams": "sampling",
    "chat.completions.create": "request",
    "completions.create": "request",
}
ENGINE_CALLS = ("LLM", "EngineArgs", "AsyncEngineArgs")


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


# ---------------------------------------------------------------------------
# Helper functions
# ---------------------------------------------------------------------------


def labs_flags(root: Path = ROOT) -> set[str]:
    """The labs' own CLI flags, from their argparse calls."""
    flags: set[str] = {"--help", "-h"}  # argparse adds them to every CLI
    for path in (root / "labs").rglob("*.py"):
        for call in re.finditer(r"add_argument\(([^)]*)", path.read_text(encoding="utf-8")):
            flags |= set(re.findall(r"[\"'](--?[a-z][\w-]*)[\"']", call.group(1)))
    return flags


def _norm_flag(flag: str) -> str:
    return flag.replace("_", "-") if flag.startswith("--") else flag


def _literal(text: str):
    """A default as typed in prose, as the YAML loader would read it."""
    low = text.strip("`").rstrip(",").lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false", "on", "off", "enabled", "disabled"):
        return low in ("true", "on", "enabled")
    try:
        number = float(low.replace(",", "").replace("_", ""))
        return int(number) if number.is_integer() and "." not in low else number
    except ValueError:
        return text.strip("`")


class Linter:
    """The rules of the module docstring over one facts file."""

    def __init__(self, facts: dict, root: Path = ROOT):
        self.facts = facts
        self.serve = {_norm_flag(f): name for f, name in vllm_facts.serve_flags(facts).items()}
        self.labs = labs_flags(root)
        self.bench = facts.get("bench_args") or {}
        self.args = {**(facts.get("server_args") or {}), **(facts.get("engine_args") or {})}
        self.removed = facts.get("removed") or {}
        self.removed_flags = {_norm_flag(k): k for k, e in self.removed.items() if e["kind"] == "flag"}
        self.request_fields = facts.get("request_fields") or {}
        self.findings: list[Finding] = []

    # -- reporting ---------------------------------------------------------

    def _add(self, path: str, line: int, message: str) -> None:
        self.findings.append(Finding(path, line, message))

    def _removed_message(self, kind: str, name: str) -> str:
        entry = vllm_facts.removed_entry(name, self.facts)
        when = f"removed in vLLM {entry['removed_in']}" if entry.get("removed_in") else \
            f"gone by vLLM {self.facts['version']}"
        return (f"{kind} {name} was {when} ({entry.get('note', '')}); instead: {entry.get('replaced_by')}. "
                f"To mention it on purpose, write {{{{ removed(\"{name}\") }}}}")

    # -- single names ------------------------------------------------------

    def flag(self, path, line, flag, context="vllm serve", extra: set[str] | None = None) -> None:
        norm = _norm_flag(flag.split("=", 1)[0])
        if norm in self.serve or norm in (extra or set()) or norm in ("--help", "-h"):
            return
        if norm in self.removed_flags:
            self._add(path, line, self._removed_message("flag", self.removed_flags[norm]))
            return
        self._add(path, line, f"{flag} is not a flag of `{context}` in labs/data/vllm.yaml "
                              f"(vLLM {self.facts['version']}); check vLLM's source and add it, or fix the name")

    def metric(self, path, line, name) -> None:
        if name.endswith("*"):  # `vllm:spec_decode_*`: a family, which must have members
            if any(m.startswith(name[:-1]) for m in self.facts.get("metrics") or {}):
                return
            self._add(path, line, f"no metric of labs/data/vllm.yaml matches {name}")
            return
        if vllm_facts.metric_base(name, self.facts) is not None:
            return
        if name in self.removed:
            self._add(path, line, self._removed_message("metric", name))
        else:
            self._add(path, line, f"metric {name} is not in labs/data/vllm.yaml (vLLM {self.facts['version']})")

    def env_var(self, path, line, name) -> None:
        if name.endswith("*") and any(v.startswith(name[:-1]) for v in self.facts.get("env_vars") or {}):
            return
        if name in (self.facts.get("env_vars") or {}):
            return
        if name in self.removed:
            self._add(path, line, self._removed_message("environment variable", name))
        else:
            self._add(path, line, f"environment variable {name} is not in labs/data/vllm.yaml "
                                  f"(vLLM {self.facts['version']})")

    def endpoint(self, path, line, route) -> None:
        route = route.rstrip(".,;:)")
        if route in ("", "/") or vllm_facts.endpoint_key(route, self.facts) is not None:
            return
        if route.rstrip("/") in vllm_facts.api_key_prefixes(self.facts):
            return
        self._add(path, line, f"endpoint {route} is not an endpoint of `vllm serve` in labs/data/vllm.yaml "
                              f"(vLLM {self.facts['version']})")

    def request_field(self, path, line, name, where: str, sampling_only: bool = False) -> None:
        entry = self.request_fields.get(name)
        if entry is not None and (not sampling_only or "SamplingParams" in entry["defaults"]):
            return
        if name in self.removed:
            self._add(path, line, self._removed_message("request field", name))
            return
        what = "a SamplingParams field" if sampling_only else "a request field"
        self._add(path, line, f"{name} ({where}) is not {what} in labs/data/vllm.yaml (vLLM {self.facts['version']})")

    def named(self, path, line, section, value, flag) -> None:
        if value not in (self.facts.get(section) or {}):
            self._add(path, line, f"{flag} {value}: {value!r} is not in {section} of labs/data/vllm.yaml")

    # -- commands ----------------------------------------------------------

    def command(self, path: str, line: int, text: str) -> None:
        """Check one vLLM command line (continuations already joined)."""
        tokens = text.split()
        if not tokens:
            return
        context, extra = "vllm serve", None
        if tokens[0] == "vllm" and len(tokens) > 1 and tokens[1] == "bench":
            command = tokens[2] if len(tokens) > 2 else ""
            if len(tokens) > 3 and f"{command} {tokens[3]}" in self.bench:
                command, tokens = f"{command} {tokens[3]}", tokens[:3] + tokens[4:]
            bench = self.bench.get(command)
            if bench is None:
                if any(t.startswith("-") for t in tokens[3:]):
                    self._add(path, line, f"`vllm bench {command}` has no bench_args in labs/data/vllm.yaml")
                return
            context, extra = f"vllm bench {command}", set(bench["flags"])
            if not bench.get("engine_flags"):
                self._bench_only(path, line, tokens[3:], context, extra)
                return
        elif tokens[0] == "vllm" and len(tokens) > 1 and tokens[1] not in ("serve",) and not tokens[1].startswith("-"):
            if any(t.startswith("-") for t in tokens[2:]):
                self._add(path, line, f"`vllm {tokens[1]}` flags are not in labs/data/vllm.yaml (only serve and bench)")
            return
        for i, token in enumerate(tokens):
            match = CMD_FLAG_RE.fullmatch(token.strip("'\""))
            if not match or token in ("-", "--"):
                continue
            flag = match.group(1)
            self.flag(path, line, flag, context, extra)
            value = match.group(2) or (tokens[i + 1] if i + 1 < len(tokens) else "")
            self.value(path, line, _norm_flag(flag), value.strip("'\""), " ".join(tokens[i + 1:]))

    def _bench_only(self, path, line, tokens, context, flags) -> None:
        for token in tokens:
            match = CMD_FLAG_RE.fullmatch(token.strip("'\""))
            if match and match.group(1) not in flags:
                self._add(path, line, f"{match.group(1)} is not a flag of `{context}` in labs/data/vllm.yaml")

    def value(self, path, line, flag, value, rest) -> None:
        """Names given as a flag's value that the file enumerates."""
        if not value or value.startswith("-"):
            return
        name = self.serve.get(flag)
        if name == "quantization":
            self.named(path, line, "quantization_methods", value, flag)
        elif name == "spec_method":
            self.named(path, line, "speculative_methods", value, flag)
        elif name in ("speculative_config", "structured_outputs_config"):
            key = "method" if name == "speculative_config" else "backend"
            section = "speculative_methods" if name == "speculative_config" else "structured_output_backends"
            found = re.search(rf"[\"']{key}[\"']\s*:\s*[\"']([\w-]+)[\"']", rest)
            if found:
                self.named(path, line, section, found.group(1), f"{flag} {key}")
        elif name is not None and value not in [str(c) for c in self.args.get(name, {}).get("choices", [value])]:
            self._add(path, line, f"{flag} {value}: not one of {self.args[name]['choices']}")

    # -- text --------------------------------------------------------------

    def macros(self, path: str, line: int, text: str) -> None:
        for match in MACRO_CALL_RE.finditer(text):
            macro, name, second = match.group(1), match.group(3), match.group(5)
            try:
                if macro in ("flag", "default"):
                    vllm_facts.arg(name, self.facts)
                elif macro == "metric":
                    vllm_facts.metric(name, self.facts)
                elif macro == "endpoint":
                    vllm_facts.endpoint(name, self.facts)
                elif macro == "env_var":
                    vllm_facts.env_var(name, self.facts)
                elif macro == "request_field":
                    vllm_facts.request_field(name, self.facts)
                elif macro == "vllm_name":
                    vllm_facts.named(name, second or "", self.facts)
                elif macro == "removed":
                    vllm_facts.removed(name, self.facts)
                elif macro == "batch_default" and name not in self.facts["batch_defaults"]["fallback"]:
                    raise vllm_facts.FactError(f"batch_default('{name}'): not a batch default")
            except (vllm_facts.FactError, KeyError) as err:
                self._add(path, line, f"{macro}(): {err}")

    def names_anywhere(self, path: str, line: int, text: str) -> None:
        for match in METRIC_RE.finditer(text):
            self.metric(path, line, match.group(0).rstrip(":"))
        for match in ENV_RE.finditer(text):
            self.env_var(path, line, match.group(0))

    def code_line(self, path: str, line: int, text: str) -> None:
        for match in URL_RE.finditer(text):
            if match.group(2):
                self.endpoint(path, line, match.group(2))
        for match in HTTP_METHOD_PATH_RE.finditer(text):
            self.endpoint(path, line, match.group(2))
        for match in API_PATH_RE.finditer(text):
            if not URL_RE.search(text[max(0, match.start() - 40):match.end()]):
                self.endpoint(path, line, match.group(0))

    def span(self, path: str, line: int, code: str, sentence: str) -> None:
        code = code.strip()
        command = _command_of(code)
        if command is not None:
            self.command(path, line, command)
        elif code.startswith("--"):
            flag = code.split()[0].split("=")[0]
            if _norm_flag(flag) not in self.serve and flag not in self.labs and not self._is_bench_flag(flag):
                self.flag(path, line, flag)
            parts = code.split(None, 1)
            value = code.split("=", 1)[1] if "=" in parts[0] else (parts[1] if len(parts) > 1 else "")
            self.value(path, line, _norm_flag(flag), value.strip("'\""), value)
        elif PATH_SPAN_RE.match(code):
            first = code.strip("/").split("/")[0]
            multi = "/" in code.strip("/")
            if code.startswith(("/v1/", "/v2/", "/inference/")) or (not multi and first not in FILESYSTEM_ROOTS):
                self.endpoint(path, line, code)
        else:
            self.code_line(path, line, code)
        self.default_claim(path, line, code, sentence)

    def _is_bench_flag(self, flag: str) -> bool:
        return any(flag in bench["flags"] for bench in self.bench.values())

    def prose(self, path: str, line: int, text: str) -> None:
        """Prose with code spans and macros blanked out (spans are checked on their own)."""
        flags = [] if LABS_COMMAND_RE.search(text) else PROSE_FLAG_RE.finditer(text)
        for match in flags:
            flag = match.group(0)
            if _norm_flag(flag) not in self.serve and flag not in self.labs and not self._is_bench_flag(flag):
                self.flag(path, line, flag)
            self.default_claim(path, line, flag, text[match.end():])
        for match in API_PATH_RE.finditer(text):
            self.endpoint(path, line, match.group(0))
        for match in HTTP_METHOD_PATH_RE.finditer(text):
            self.endpoint(path, line, match.group(2))

    def request_spans(self, path: str, line: int, raw: str) -> None:
        for pattern in REQUEST_SPAN_RE:
            for match in pattern.finditer(raw):
                name = match.group(1)
                if name not in self.request_fields and name not in self.args:
                    self.request_field(path, line, name, "named as a field")

    def default_claim(self, path: str, line: int, name: str, after: str) -> None:
        """`name` ... defaults to X: X must be what the file says."""
        arg = self.serve.get(_norm_flag(name.split("=")[0])) if name.startswith("-") else \
            (name if name in self.args else None)
        if arg is None:
            return
        match = DEFAULT_CLAIM_RE.match(after)
        if not match:
            return
        said = _literal(match.group(1))
        entry = self.args[arg]
        allowed = [entry.get("default"), entry.get("resolved"), entry.get("cli_default", entry.get("default")),
                   entry.get("config_default", entry.get("default")), entry.get("llm_default", entry.get("default"))]
        if entry.get("resolved_for"):
            for tier in self.facts["batch_defaults"]["tiers"]:
                allowed += [tier[ctx][arg] for ctx in ("OPENAI_API_SERVER", "LLM_CLASS") if arg in tier[ctx]]
            allowed += [self.facts["batch_defaults"]["fallback"].get(arg)]
        if any(said == value or str(said) == str(value) for value in allowed):
            return
        self._add(path, line, f"says {entry['flag']} defaults to {match.group(1)!r}, but labs/data/vllm.yaml "
                              f"(vLLM {self.facts['version']}) has {entry.get('resolved', entry['default'])!r}; "
                              f"render it with {{{{ flag(\"{arg}\") }}}} or {{{{ default(\"{arg}\") }}}}")

    # -- python and JSON ----------------------------------------------------

    def code_block(self, path: str, start: int, lines: list[str], language: str) -> None:
        text = "\n".join(lines)
        for call in re.finditer(r"(?<![\w.])(" + "|".join(ENGINE_CALLS) + r")\(", text):
            for name, offset in _kwargs(text, call.end()):
                if name not in (self.facts.get("engine_args") or {}) and name != "model":
                    self._arg_kwarg(path, start + text.count("\n", 0, offset), name, call.group(1))
        for call in re.finditer(r"(?<![\w])(SamplingParams|(?:\w+\.)?chat\.completions\.create|"
                                r"(?<!chat\.)(?:\w+\.)?completions\.create)\(", text):
            sampling = call.group(1) == "SamplingParams"
            for name, offset in _kwargs(text, call.end()):
                if name in OPENAI_CLIENT_KWARGS:
                    continue
                self.request_field(path, start + text.count("\n", 0, offset), name, f"{call.group(1)}()",
                                   sampling_only=sampling)
        for body in re.finditer(r"extra_body\s*=\s*\{", text):
            for name, offset in _dict_keys(text, body.end() - 1):
                self.request_field(path, start + text.count("\n", 0, offset), name, "extra_body")
        for body in re.finditer(r"(?:-d|--data(?:-raw)?|--json)\s+'(\{.*?\})'", text, re.DOTALL):
            self._json_body(path, start + text.count("\n", 0, body.start()), body.group(1))
        if language == "json":
            self._json_body(path, start, text, only_requests=True)

    def _arg_kwarg(self, path, line, name, call) -> None:
        gone = vllm_facts.removed_entry(name, self.facts)
        if gone is not None:
            self._add(path, line, self._removed_message("argument", name))
        else:
            self._add(path, line, f"{call}({name}=...): {name} is not an engine argument in labs/data/vllm.yaml")

    def _json_body(self, path, line, text, only_requests=False) -> None:
        try:
            body = json.loads(text)
        except ValueError:
            return
        if not isinstance(body, dict) or (only_requests and not ({"messages", "prompt"} & set(body))):
            return
        for key in body:
            self.request_field(path, line, key, "request body")


def _command_of(text: str) -> str | None:
    """The vLLM command in a shell line, or None when the line runs something else."""
    text = text.strip()
    text = re.sub(r"^(?:\$|#|>)\s+", "", text)
    words = text.split()
    i = 0
    while i < len(words) and (re.match(r"^[A-Z_][A-Z0-9_]*=", words[i]) or words[i] in ("sudo", "time", "exec")):
        i += 1
    if i < len(words) - 1 and words[i] == "uv" and words[i + 1] == "run":
        i += 2
    rest = words[i:]
    if not rest:
        return None
    if rest[0] == "docker" and any("vllm/vllm-openai" in w for w in rest):
        image = next(j for j, w in enumerate(rest) if "vllm/vllm-openai" in w)
        return "vllm serve " + " ".join(rest[image + 1:])
    if rest[0] == "vllm":
        return " ".join(rest)
    if rest[:3] in (["python", "-m", "vllm.entrypoints.openai.api_server"],
                    ["python3", "-m", "vllm.entrypoints.openai.api_server"]):
        return "vllm serve " + " ".join(rest[3:])
    return None


def _kwargs(text: str, open_at: int) -> list[tuple[str, int]]:
    """Top-level keyword names of the call whose argument list starts at `open_at`."""
    depth, out, i = 1, [], open_at
    while i < len(text) and depth:
        ch = text[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch in "\"'":
            end = text.find(ch, i + 1)
            i = end if end > 0 else i
        elif depth == 1:
            match = re.match(r"(\w+)\s*=(?!=)", text[i:])
            if match and (i == open_at or not (text[i - 1].isalnum() or text[i - 1] == "_")):
                out.append((match.group(1), i))
                i += match.end() - 1
        i += 1
    return out


def _dict_keys(text: str, brace_at: int) -> list[tuple[str, int]]:
    """String keys at the top level of the dict literal opening at `brace_at`."""
    depth, out, i = 0, [], brace_at
    while i < len(text):
        ch = text[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                break
        elif ch in "\"'":
            end = text.find(ch, i + 1)
            if depth == 1 and re.match(r"\s*:", text[end + 1:]):
                out.append((text[i + 1:end], i))
            i = end
        i += 1
    return out


def _blank(text: str, pattern: re.Pattern) -> str:
    return pattern.sub(lambda m: " " * len(m.group(0)), text)


# ---------------------------------------------------------------------------
# Lint
# ---------------------------------------------------------------------------


def lint_text(rel: str, text: str, facts: dict, root: Path = ROOT) -> list[Finding]:
    """Every finding in one content file's text."""
    linter = Linter(facts, root)
    fence: tuple[str, str] | None = None  # (marker, language)
    block: list[str] = []
    block_start = 0
    pending = ""  # a command continued with a trailing backslash
    pending_line = 0
    yaml_code: int | None = None  # indent of a question's `code: |` key while inside its block
    language = ""
    for number, raw in enumerate(text.splitlines(), start=1):
        linter.macros(rel, number, raw)
        # Whatever a removed() call names is a deliberate mention: skip it below.
        line = _blank(raw, re.compile(r"\{\{\s*removed\(.*?\)\s*\}\}"))
        if rel.endswith(".yaml"):
            if yaml_code is not None and line.strip() and len(line) - len(line.lstrip()) <= yaml_code:
                linter.code_block(rel, block_start, block, language)
                yaml_code = None
            if yaml_code is not None:
                block.append(line)
                code = _blank(line, MACRO_RE)
                linter.names_anywhere(rel, number, code)
                linter.code_line(rel, number, code)
                command = _command_of(code)
                if command is not None:
                    linter.command(rel, number, command)
                continue
            if YAML_LANGUAGE_RE.match(line):
                language = YAML_LANGUAGE_RE.match(line).group(1).lower()
            opened_code = YAML_CODE_RE.match(line)
            if opened_code:
                yaml_code, block, block_start = len(opened_code.group(1)), [], number + 1
                continue
        opened = FENCE_RE.match(line)
        if fence is None and opened:
            fence, block, block_start = (opened.group(2)[0] * 3, opened.group(3).lower()), [], number + 1
            continue
        if fence is not None:
            if line.strip().startswith(fence[0]):
                linter.code_block(rel, block_start, block, fence[1])
                fence = None
                continue
            block.append(line)
            code = _blank(line, MACRO_RE)
            linter.names_anywhere(rel, number, code)
            linter.code_line(rel, number, code)
            joined = (pending + " " + code.strip()) if pending else code
            if joined.rstrip().endswith("\\"):
                pending, pending_line = joined.rstrip()[:-1], pending_line or number
                continue
            command = _command_of(joined)
            if command is not None:
                linter.command(rel, pending_line or number, command)
            pending, pending_line = "", 0
            continue
        text_line = _blank(line, MACRO_RE)
        linter.names_anywhere(rel, number, text_line)
        linter.request_spans(rel, number, text_line)
        for span in SPAN_RE.finditer(text_line):
            linter.span(rel, number, span.group(2), text_line[span.end():])
        linter.prose(rel, number, _blank(text_line, SPAN_RE))
    if yaml_code is not None:
        linter.code_block(rel, block_start, block, language)
    return linter.findings


def content_files(root: Path = ROOT) -> list[Path]:
    files: set[Path] = set()
    for pattern in CONTENT_GLOBS:
        files |= set(root.glob(pattern))
    return sorted(p for p in files if p.is_file())


def lint_tree(root: Path = ROOT, facts: dict | None = None) -> list[Finding]:
    facts = facts or vllm_facts.load()
    findings: list[Finding] = []
    for path in content_files(root):
        findings += lint_text(path.relative_to(root).as_posix(), path.read_text(encoding="utf-8"), facts, root)
    return findings


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------

FACTS = vllm_facts.load()
FILES = content_files()


def test_there_is_content_to_lint():
    assert any(p.suffix == ".md" for p in FILES) and any(p.suffix == ".yaml" for p in FILES)


@pytest.mark.parametrize("path", FILES, ids=[p.relative_to(ROOT).as_posix() for p in FILES])
def test_every_vllm_name_is_in_the_facts_file(path):
    rel = path.relative_to(ROOT).as_posix()
    findings = lint_text(rel, path.read_text(encoding="utf-8"), FACTS)
    assert not findings, f"{len(findings)} vLLM name(s) not backed by labs/data/vllm.yaml:\n  " + \
        "\n  ".join(map(str, findings))


# A planted line per rule, and the words its finding must contain.
PLANTED = [
    ("`--gpu-memory-utilization` defaults to 0.9 in vLLM.", ["--gpu-memory-utilization", "'0.9'", "0.92"]),
    ("`--kv-cache-dtype` (default `fp8`) halves the cache.", ["--kv-cache-dtype", "fp8", "'auto'"]),
    ("```bash\nvllm serve meta-llama/Llama-3.1-8B-Instruct --swap-space 4\n```",
     ["--swap-space", "removed in vLLM 0.18.0", "removed(\"--swap-space\")"]),
    ("Set `--max-batch-size 512` to cap the batch.", ["--max-batch-size", "not a flag of `vllm serve`"]),
    ("Scrape `vllm:gpu_cache_usage_perc` for KV usage.", ["vllm:gpu_cache_usage_perc", "removed in vLLM 0.12.0",
                                                          "vllm:kv_cache_usage_perc"]),
    ("Alert on `vllm:kv_cache_usage_percent`.", ["metric vllm:kv_cache_usage_percent is not in"]),
    ("Probe `/healthz` from Kubernetes.", ["endpoint /healthz"]),
    ("```bash\ncurl http://localhost:8000/v1/generate -d '{\"prompt\": \"hi\"}'\n```", ["endpoint /v1/generate"]),
    ("Export `VLLM_ATTENTION_BACKEND=FLASH_ATTN`.", ["VLLM_ATTENTION_BACKEND", "--attention-backend"]),
    ("```python\nSamplingParams(temperature=0.0, max_new_tokens=64)\n```", ["max_new_tokens", "SamplingParams"]),
    ("```bash\ncurl localhost:8000/v1/completions -d '{\"prompt\": \"x\", \"guided_json\": {}}'\n```",
     ["guided_json", "removed in vLLM 0.12.0"]),
    ("```python\nLLM(model=\"m\", gpu_memory_utilisation=0.8)\n```", ["gpu_memory_utilisation", "engine argument"]),
    ("```bash\nvllm serve m --quantization bitsandbytes\n```", ["bitsandbytes", "quantization_methods"]),
    ("Width {{ flag(\"max_num_seq\") }}.", ["flag()", "max_num_seq", "max_num_seqs"]),
]


def _sample_file() -> Path:
    lessons = sorted((ROOT / "docs" / "lessons").glob("part-*/*.md"))
    return lessons[0] if lessons else ROOT / "docs" / "index.md"


@pytest.mark.parametrize("planted,expected", PLANTED, ids=[p[0][:40] for p in PLANTED])
def test_a_planted_mistake_in_a_copy_of_a_page_is_caught(tmp_path, planted, expected):
    """Copy a real page, plant one wrong vLLM name or default, and lint the copy: one finding, naming it."""
    source = _sample_file()
    copy = tmp_path / source.relative_to(ROOT)
    copy.parent.mkdir(parents=True)
    shutil.copy(source, copy)
    original = lint_text("copy", copy.read_text(encoding="utf-8"), FACTS)
    copy.write_text(copy.read_text(encoding="utf-8") + "\n\n" + planted + "\n", encoding="utf-8")
    rel = copy.relative_to(tmp_path).as_posix()
    findings = [f for f in lint_text(rel, copy.read_text(encoding="utf-8"), FACTS)
                if f.message not in {o.message for o in original}]
    assert findings, f"the lint missed: {planted!r}"
    text = "\n".join(map(str, findings))
    for word in expected:
        assert word in text, f"the finding for {planted!r} does not name {word!r}:\n{text}"
    assert all(f.path == rel and f.line > 1 for f in findings)


def test_the_same_line_through_removed_is_accepted():
    text = 'V0 had {{ removed("--swap-space", "0.18.0") }}; V1 recomputes. Old dashboards read ' \
           '{{ removed("vllm:gpu_cache_usage_perc") }}.\n'
    assert lint_text("page.md", text, FACTS) == []


def test_the_labs_own_flags_are_not_vllms():
    text = "```bash\npython -m labs.serving_sim --gpu h200 --step-overhead-ms 2\n```\nPass `--gpu h200` to the lab.\n"
    assert lint_text("page.md", text, FACTS) == []


def test_a_correct_default_and_another_tools_flag_pass():
    text = ("`--gpu-memory-utilization` defaults to 0.92. `--max-num-seqs` defaults to 256 on an A100.\n"
            "`--max-model-len` defaults to the model's own limit. `--enable-prefix-caching` is on by default.\n"
            "Run `nvidia-smi --query-gpu=memory.total --format=csv` first.\n")
    assert lint_text("page.md", text, FACTS) == []


def test_a_wrong_default_in_a_question_names_file_and_line(tmp_path):
    question = tmp_path / "questions" / "part-5" / "planted.yaml"
    question.parent.mkdir(parents=True)
    question.write_text("title: Planted\nanswer: >-\n  vLLM keeps `--block-size` (default 32) tokens per block.\n",
                        encoding="utf-8")
    findings = lint_tree(tmp_path, FACTS)
    assert [(f.path, f.line) for f in findings] == [("questions/part-5/planted.yaml", 3)], findings
    assert "--block-size" in findings[0].message and "'32'" in findings[0].message


def test_python_in_a_question_snippet_is_checked(tmp_path):
    question = tmp_path / "questions" / "part-5" / "snippet.yaml"
    question.parent.mkdir(parents=True)
    question.write_text(
        "title: Snippet\ncode:\n  snippets:\n    - language: python\n      runnable: false\n      code: |\n"
        "        from vllm import LLM\n        llm = LLM(model=\"m\", max_num_seqs=8,\n"
        "                  swap_space=4)\nweak_answer: x\n", encoding="utf-8")
    findings = lint_tree(tmp_path, FACTS)
    assert [(f.path, f.line) for f in findings] == [("questions/part-5/snippet.yaml", 9)], findings
    assert "removed in vLLM 0.18.0" in findings[0].message


def test_a_removed_name_in_a_macro_fails_the_build():
    """flag() on a removed argument raises, so the strict build fails with the same explanation."""
    pytest.importorskip("pydantic")
    import macros

    env = _MacroEnv()
    macros.register_vllm_macros(env)
    with pytest.raises(macros.MacroError, match=r"removed in vLLM 0\.18\.0"):
        env.macros["flag"]("swap_space")
    with pytest.raises(macros.MacroError, match="Did you mean 'gpu_memory_utilization'"):
        env.macros["default"]("gpu_memory_utilisation")
    with pytest.raises(macros.MacroError, match="says it was removed in 0.18.0"):
        env.macros["removed"]("--swap-space", "0.17.0")
    assert env.macros["removed"]("--swap-space", "0.18.0").startswith("~~`--swap-space`~~ ([removed in vLLM 0.18.0]")


class _MacroEnv:
    """The part of mkdocs-macros' env that register_vllm_macros uses, on a page of the reference section."""

    def __init__(self):
        self.macros: dict = {}
        self.page = type("Page", (), {"file": type("File", (), {"src_uri": "lessons/part-5/x.md"})()})()

    def macro(self, fn, name=None):
        self.macros[name or fn.__name__] = fn
        return fn
