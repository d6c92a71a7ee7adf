"""The catalogue of type names (protocol/catalogue.py) against the code, the docs and the wire.

Every dotted type name the package's source spells is a member of a table, every member is
used by the code and documented in docs/protocol.md, and the docs name no type the tables
lack. A member on the wire is byte for byte its string.
"""

from __future__ import annotations

import ast
import json
import re
import sqlite3
from pathlib import Path

import msgpack
import pytest

from ratchet.protocol.catalogue import ADMIN_TYPE_PREFIX, EventType, MessageType, admin_type
from ratchet.protocol.messages import Envelope, Event
from tests.conftest import ROOT

PACKAGE = ["protocol", "persistence", "actors", "supervisors", "ratchet"]
CATALOGUE = ROOT / "protocol" / "catalogue.py"
#: A whole string literal shaped like a type name: two lowercase dotted words.
TYPE_SHAPE = re.compile(r"[a-z][a-z_]*\.[a-z][a-z_]*")
#: Dotted strings that are not message or event types, by their first word.
NOT_TYPES = {
    "ratchet",  # logger names (ratchet.task, ratchet.mail, ...)
    "nats",  # the CLI's nats.url option
    "chat",  # the OpenAI object name chat.completion (the model stub)
    "expense",  # workflow names (expense.agent, expense.split)
    "audit",  # the audit seal's file names (audit.head, audit.key)
    "error", "messaging", "exception",  # OpenTelemetry attribute names (error.type, ...)
}
#: f-strings that start with a type family's word but build no type: the agent
#: conversation's state-key prefix (agent.<node>.).
F_STRING_NOT_TYPES = {("actors/task/agent_conversation.py", "agent.")}

EVENTS = {m.value for m in EventType}
MESSAGES = {m.value for m in MessageType}
FAMILIES = {v.split(".")[0] for v in EVENTS | MESSAGES} | {ADMIN_TYPE_PREFIX.rstrip(".")}


def _sources() -> list[Path]:
    paths = {p.resolve() for folder in PACKAGE for p in (ROOT / folder).rglob("*.py")}
    return sorted(paths - {CATALOGUE.resolve()})


def _scan() -> tuple[dict[str, list[str]], set[str], list[str]]:
    """Type-shaped literals (value → where), catalogue members referenced by name, and
    f-strings that start with a type family."""
    literals: dict[str, list[str]] = {}
    referenced: set[str] = set()
    f_strings: list[str] = []
    for path in _sources():
        where = str(path.relative_to(ROOT.resolve()))
        tree = ast.parse(path.read_text(), where)
        in_f_string = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)
                       for v in n.values}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in in_f_string and TYPE_SHAPE.fullmatch(node.value) \
                    and node.value.split(".")[0] not in NOT_TYPES:
                literals.setdefault(node.value, []).append(f"{where}:{node.lineno}")
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in ("EventType", "MessageType"):
                table = EventType if node.value.id == "EventType" else MessageType
                referenced.add(table[node.attr].value)
            elif isinstance(node, ast.JoinedStr) and node.values \
                    and isinstance(node.values[0], ast.Constant):
                head = str(node.values[0].value)
                word = head.split(".")[0]
                if "." in head and word in FAMILIES and TYPE_SHAPE.match(head + "x") \
                        and (where, head) not in F_STRING_NOT_TYPES:
                    f_strings.append(f"{where}:{node.lineno} f{head!r}...")
    return literals, referenced, f_strings


def test_every_type_name_the_code_spells_is_in_a_table_and_the_runtime_spells_none() -> None:
    literals, _, _ = _scan()
    unknown = {v: w for v, w in literals.items() if v not in EVENTS | MESSAGES}
    assert unknown == {}
    # The runtime names every type through the tables; only test components spell one.
    spelled = {v: w for v, w in literals.items()
               if any(not x.startswith("ratchet/testing/") for x in w)}
    assert spelled == {}
    # The scan is not vacuous: it finds the demo's literal.
    assert "ratchet/testing/demo.py" in " ".join(literals.get("task.succeeded", []))


def test_no_type_name_is_assembled_from_pieces() -> None:
    _, _, f_strings = _scan()
    assert f_strings == [], "build type names from the catalogue (admin_type for admin.<verb>)"


def test_every_member_of_the_tables_is_used_by_the_code() -> None:
    literals, referenced, _ = _scan()
    unused = (EVENTS | MESSAGES) - set(literals) - referenced
    assert unused == set()
    assert len(referenced) > 20  # the layers name most types through the tables


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def _table_rows(section: str, header: str) -> list[list[str]]:
    lines = section[section.index(header):].splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _documented_events() -> set[str]:
    events = _section((ROOT / "docs" / "protocol.md").read_text(), "Events")
    names: set[str] = set()
    for first, second, *_ in _table_rows(events, "| type | when | payload |"):
        for name in re.findall(r"`([^`]+)`", first):
            if name.endswith(".*"):  # a family: its members are listed in the next cell
                family = name[:-2]
                for member in re.findall(r"`((?:[a-z_]+)?\.[a-z_]+)`", second):
                    names.add(member if member.startswith(family) else family + member)
            else:
                names.add(name)
    return names


def _documented_messages() -> set[str]:
    messages = _section((ROOT / "docs" / "protocol.md").read_text(), "Messages")
    rows = _table_rows(messages, "| type | sent on | from → to |")
    return {name for row in rows for name in re.findall(r"`([^`]+)`", row[0])}


def test_the_documented_event_types_are_exactly_the_event_table() -> None:
    documented = _documented_events()
    assert len(documented) > 40
    assert documented == EVENTS


def test_the_documented_message_types_are_exactly_the_message_table_and_admin_verbs() -> None:
    documented = _documented_messages()
    assert documented == MESSAGES | {ADMIN_TYPE_PREFIX + "<verb>"}
    assert admin_type("cancel") == "admin.cancel"


def test_the_tables_have_no_repeated_values_and_do_not_overlap() -> None:
    for table in (EventType, MessageType):
        assert len(table.__members__) == len(list(table))  # no aliases
        assert len({m.value for m in table}) == len(list(table))
    assert not EVENTS & MESSAGES
    assert all(TYPE_SHAPE.fullmatch(v) for v in EVENTS | MESSAGES)


@pytest.mark.parametrize("member", [*EventType, *MessageType], ids=str)
def test_a_member_is_written_exactly_as_its_string(member: EventType | MessageType) -> None:
    text = member.value
    assert member == text and hash(member) == hash(text) and f"{member}" == text
    assert msgpack.packb({"type": member}, use_bin_type=True) \
        == msgpack.packb({"type": text}, use_bin_type=True)
    assert json.dumps(member) == json.dumps(text)
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t(v TEXT)")
    db.execute("INSERT INTO t VALUES (?)", (member,))
    assert db.execute("SELECT v, typeof(v) FROM t").fetchone() == (text, "text")
    assert db.execute("SELECT count(*) FROM t WHERE v = ?", (text,)).fetchone() == (1,)
    # pydantic keeps a plain str, so a model dumped later carries no enum either.
    env = Envelope(type=member, message_id="m", correlation_id="c")
    assert type(env.type) is str and type(env.model_dump()["type"]) is str
    event = Event(event_id="e", task_id="t", tenant="a", sequence=1, type=member,
                  aggregate_version=1, occurred_at=0.0, producer="n")
    assert type(event.type) is str
