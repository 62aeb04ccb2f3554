"""The training command of a bash launch script, without running it.

Enough of bash for the launch scripts Megatron-LM and NeMo ship: ``NAME=value`` and
``export``, arrays (``A=( ... )``, ``A+=( ... )``, ``${A[@]}``), ``$NAME``, ``${NAME}``,
``${NAME:-default}``, ``$((a * b))``, positional parameters (unset, as when the script is
run without arguments; ``$?`` is 0), line continuations, comments and ``if [[ ... ]]; then /
elif / else / fi`` with string, pattern and integer tests (``==``, ``!=``, ``-z``, ``-n``,
``-eq``, ``-lt``, ...; file tests are false: the paths a script names are on the training
cluster, not here), double-quoted strings over several lines and here-documents (read line
by line). Every other command is skipped. The training command is the line that runs a
``.py`` file or, where no line does, the last such command inside a string the script assigns
(``CMD="cd x; python train.py ..."``, run later by ``bash -c "$CMD"``); its arguments are split
into the launcher's (``torchrun --nproc_per_node 8``) and the program's.
"""

from __future__ import annotations

import ast
import contextlib
import fnmatch
import operator
import re
import shlex
from dataclasses import dataclass, field

from echosim.configs.base import ConfigError

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ASSIGN = re.compile(rf"^(?:export\s+|local\s+|declare\s+(?:-\w+\s+)?)?({_NAME})(\+?)=(.*)$", re.S)
_HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
_VAR = re.compile(rf"\$\(\((?P<arith>.*?)\)\)|\$\{{(?P<braced>[^}}]*)\}}|\$(?P<plain>{_NAME}|[0-9#@*?])")


@dataclass
class Launch:
    """A launch script's training command: the launcher's words and the program's arguments."""

    launcher: list[str] = field(default_factory=list)  # e.g. torchrun --nproc_per_node 8 --nnodes 1
    program: str = ""  # the .py file run
    args: list[str] = field(default_factory=list)
    line: int = 0


@dataclass
class _Shell:
    where: str
    scalars: dict[str, str] = field(default_factory=dict)
    arrays: dict[str, list[str]] = field(default_factory=dict)

    def expand(self, text: str) -> str:
        """``text`` with its variables, array expansions and arithmetic substituted."""

        def one(match: re.Match[str]) -> str:
            if match.group("arith") is not None:
                return str(self.arithmetic(self.expand(match.group("arith"))))
            body = match.group("braced") if match.group("braced") is not None else match.group("plain")
            name, _, default = body.partition(":-")
            if name == "?":  # the commands before it are not run here: each is taken to succeed
                return "0"
            if name.endswith("[@]") or name.endswith("[*]"):
                return " ".join(self.arrays.get(name[:-3], []))
            if name in self.arrays:
                values = self.arrays[name]
                return values[0] if values else ""
            value = self.scalars.get(name, "")
            return value if value or not default else self.expand(_unquote(default))

        return _VAR.sub(one, text)

    def arithmetic(self, expr: str) -> int:
        names = re.sub(_NAME, lambda m: self.scalars.get(m.group(0), "0") or "0", expr)
        try:
            return _evaluate(ast.parse(names.strip(), mode="eval").body)
        except (SyntaxError, ValueError, ZeroDivisionError):
            raise ConfigError(f"{self.where}: cannot evaluate $(({expr}))") from None

    def words(self, text: str) -> list[str]:
        """``text`` expanded and split into words as bash would (comments dropped)."""
        expanded = self.expand(text)
        try:
            return shlex.split(expanded, comments=True)
        except ValueError as exc:
            raise ConfigError(f"{self.where}: cannot split {text.strip()!r} ({exc})") from None

    def test(self, condition: str, line: int) -> bool:
        """An ``if`` condition: ``[[ a == b ]] || [ -z c ]`` and the like."""
        result: bool | None = None
        joiner = ""
        for part in re.split(r"(\|\||&&)", condition):
            part = part.strip()
            if part in ("||", "&&"):
                joiner = part
                continue
            value = self._atom(part, line)
            if result is None:
                result = value
            elif joiner == "||":
                result = result or value
            else:
                result = result and value
        return bool(result)

    def _atom(self, part: str, line: int) -> bool:
        inner = part.strip()
        negate = inner.startswith("!")
        inner = inner.lstrip("!").strip()
        if inner.startswith("[[") and inner.endswith("]]"):
            inner = inner[2:-2]
        elif inner.startswith("[") and inner.endswith("]"):
            inner = inner[1:-1]
        else:
            raise ConfigError(f"{self.where}:{line}: cannot evaluate the condition {part!r}")
        inner = inner.strip()
        negate ^= inner.startswith("! ")
        double = part.strip().lstrip("!").strip().startswith("[[")
        words = self.words(inner.removeprefix("! "))
        binary = [k for k, w in enumerate(words) if w in ("==", "=", "!=", *_INT_TESTS)]
        if double and len(binary) == 1:  # [[ ]] does not split an expansion into words: one operand each side
            k = binary[0]
            words = [" ".join(words[:k]), words[k], " ".join(words[k + 1 :])]
        if len(words) == 3 and words[1] in ("==", "=", "!="):
            # [[ a == b* ]] matches a pattern (quoting is not kept here: a quoted * matches as a pattern too)
            same = fnmatch.fnmatchcase(words[0], words[2]) if double else words[0] == words[2]
            value = same == (words[1] != "!=")
        elif len(words) == 3 and words[1] in _INT_TESTS:
            value = _INT_TESTS[words[1]](self._integer(words[0], part, line), self._integer(words[2], part, line))
        elif len(words) == 2 and words[0] in ("-z", "-n"):
            value = (words[1] == "") == (words[0] == "-z")
        elif len(words) == 1 and words[0] == "-z":
            value = True
        elif len(words) == 1 and words[0] == "-n":
            value = False
        elif len(words) == 2 and words[0] in ("-f", "-d", "-e", "-s", "-x", "-r"):
            value = False  # the script's paths live on the training cluster
        else:
            raise ConfigError(f"{self.where}:{line}: cannot evaluate the condition {part!r}")
        return value != negate

    def _integer(self, word: str, part: str, line: int) -> int:
        """An operand of ``-eq`` and the like: an integer, '' (an unset variable) as 0, as ``[[ ]]`` takes it."""
        try:
            return int(word or "0")
        except ValueError:
            raise ConfigError(f"{self.where}:{line}: cannot evaluate the condition {part!r}") from None


_INT_TESTS = {"-eq": operator.eq, "-ne": operator.ne, "-lt": operator.lt, "-le": operator.le,
              "-gt": operator.gt, "-ge": operator.ge}  # fmt: skip


_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.floordiv,  # bash arithmetic is integer
    ast.Mod: operator.mod,
}


def _evaluate(node: ast.expr) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return int(_OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right)))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    raise ValueError("not integer arithmetic")


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines with continuations and multi-line quoted strings joined and comments dropped, each with its first
    line number (``CMD="cd x;\n python train.py ..."`` is one line, its newlines kept)."""
    out: list[tuple[int, str]] = []
    pending, start, quote, heredoc = "", 0, "", ""
    for number, raw in enumerate(text.splitlines(), 1):
        if heredoc and raw.strip() == heredoc:  # a here-document's lines are read one by one, quotes and all
            heredoc = ""
            continue
        line, quote_after = _strip_comment(raw, "" if heredoc else quote)
        if not pending:
            start = number
        if quote_after and not heredoc:  # a quoted string runs on to the next line
            if quote_after == '"' and line.endswith("\\"):
                pending += line[:-1]  # bash drops a backslash-newline inside double quotes
            else:
                pending += line + "\n"
            quote = quote_after
            continue
        quote = ""
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        if pending.strip():
            out.append((start, pending.strip()))
            opened = _HEREDOC.search(pending)
            heredoc = opened.group(1) if opened and not heredoc else heredoc
        pending = ""
    if pending.strip():
        out.append((start, pending.strip()))
    return out


def _strip_comment(line: str, quote: str = "") -> tuple[str, str]:
    """``line`` without a ``#`` comment (a ``#`` inside quotes or ``${#...}`` is kept), and the quote still open at
    its end ('' when none); ``quote`` is the one open from the line before."""
    escaped = False
    for i, ch in enumerate(line):
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t;(") and not line[max(0, i - 2) : i].endswith("${"):
            return line[:i].rstrip(), ""
    return (line if quote else line.rstrip()), quote


def _array_body(lines: list[tuple[int, str]], i: int, first: str) -> tuple[str, int]:
    """The text between ``(`` and its ``)`` of an array assignment that may span lines."""
    body = first
    while not _closes(body):
        i += 1
        if i >= len(lines):
            break
        body += "\n" + lines[i][1]
    return body.strip()[1:].rstrip().removesuffix(")"), i


def _closes(body: str) -> bool:
    depth, quote = 0, ""
    for ch in body:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
    return depth <= 0


def launch_command(text: str, where: str) -> Launch | None:
    """The last command of the script that runs a ``.py`` program, with variables substituted."""
    shell = _Shell(where)
    lines = _logical_lines(text)
    active: list[tuple[bool, bool]] = []  # per open if: (this branch runs, an earlier branch ran)
    found: Launch | None = None
    kept: Launch | None = None  # the last command found in a string assigned for later (used when no line runs one)
    i = 0
    while i < len(lines):
        number, line = lines[i]
        running = all(a for a, _ in active)
        head = line.split(None, 1)[0] if line.split() else ""
        if head in ("if", "elif"):
            condition = re.sub(r";?\s*then\s*$", "", line.split(None, 1)[1] if " " in line else "")
            if head == "if":
                value = running and shell.test(condition, number)
                active.append((value, value))
            else:
                _, done = active[-1] if active else (False, True)
                outer = all(a for a, _ in active[:-1])
                value = outer and not done and shell.test(condition, number)
                active[-1] = (value, done or value)
            i += 1
            continue
        if head == "else" and active:
            _, done = active[-1]
            active[-1] = (not done, True)
            i += 1
            continue
        if head == "fi" and active:
            active.pop()
            i += 1
            continue
        if head == "then":
            i += 1
            continue
        match = _ASSIGN.match(line)
        if match and not line.startswith(("if ", "for ", "while ")):
            name, append, value = match.groups()
            if value.startswith("("):
                body, i = _array_body(lines, i, value)
                if running:
                    items = [w for item in shell.words(body) for w in item.split()]
                    shell.arrays[name] = (shell.arrays.get(name, []) if append else []) + items
            elif running:
                words = shell.words(value)
                if len(words) > 1:  # ``VAR=1 torchrun ...``: an environment prefix on a command
                    found = _launch(words[1:], number) or found
                else:
                    shell.scalars[name] = (shell.scalars.get(name, "") if append else "") + "".join(words)
                    # ``CMD="cd x; python train.py ${ARGS[@]}"`` run later by ``bash -c "$CMD"`` or ``srun $CMD``
                    kept = _string_launch("".join(words), number) or kept
            i += 1
            continue
        if running:
            with contextlib.suppress(ConfigError):  # a line bash could not split runs no training program
                found = _launch(shell.words(line), number) or found
        i += 1
    return found or kept


def _string_launch(value: str, number: int) -> Launch | None:
    """The last command in a string a script keeps to run later (one per line or ``;``) that runs a ``.py``
    program: its variables were expanded when it was assigned, as bash expands a double-quoted string."""
    if ".py" not in value:
        return None
    found = None
    for part in re.split(r"[;\n]|&&", value):
        with contextlib.suppress(ValueError):
            found = _launch(shlex.split(part, comments=True), number) or found
    return found


def _launch(words: list[str], number: int) -> Launch | None:
    program = next((k for k, w in enumerate(words) if w.endswith(".py")), None)
    if program is None:
        return None
    return Launch(words[:program], words[program], words[program + 1 :], number)
