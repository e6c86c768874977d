"""The conformance cases every client library runs (clients/conformance/cases.txt, the behaviours of
clients/README.md written once), against a real gate started with clients/conformance/gate.toml."""

import os

import pytest

from existence_gate_client import MISSING, GateClient, GateError, GatedReader
from conftest import Gate, closed_port_address, eventually

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "conformance")
#: The tests' call deadline (a loaded 2-core machine); the library's default is 0.5 s.
DEADLINE = 10.0


def read_cases():
    """[(number, name, [(line, words)])] from cases.txt."""
    cases = []
    with open(os.path.join(HERE, "cases.txt")) as f:
        for index, text in enumerate(f, start=1):
            words = text.split("#", 1)[0].split()
            if not words:
                continue
            if words[0] == "case":
                cases.append((len(cases) + 1, " ".join(words[1:]), []))
            else:
                cases[-1][2].append((index, words))
    return cases


CASES = read_cases()


def split_arrow(words):
    arrow = words.index("->")
    return words[:arrow], words[arrow + 1 :]


@pytest.fixture(scope="module")
def conformance_gate():
    with open(os.path.join(HERE, "gate.toml")) as f:
        gate = Gate([], extra_config=f.read())
    yield gate
    gate.stop()


class Run:
    """A case being run: its options until the first call, then its client (and reader)."""

    def __init__(self, number, lines, gate):
        self.number, self.lines, self.gate_address = number, lines, gate.grpc_addr
        self.dead = closed_port_address()
        self.options = {"deadline": DEADLINE}
        self.namespace = "users"
        self.addresses = [self.gate_address]
        self.table = {}
        self.gate = self.reader = None

    def key(self, word):
        if word == "<empty>":
            return b""
        if word == "<oversized>":
            return b"x" * 1025
        return "{}:{}".format(self.number, word).encode()

    def client(self):
        if self.gate is None:
            self.gate = GateClient(self.addresses, self.namespace, **self.options)
        return self.gate

    def stats(self):
        return (self.reader or self.gate).stats().as_dict()

    def line(self, words):
        verb, rest = words[0], words[1:]
        if verb == "option":
            self.option(*rest)
        elif verb == "add":
            self.client().add([self.key(w) for w in rest])
        elif verb == "lookup":
            self.lookup(rest)
        elif verb == "many":
            self.many(rest)
        elif verb == "stats":
            self.check_stats(rest)
        elif verb == "reader":
            self.reader = GatedReader(self.client(), lambda key: self.table.get(key, MISSING))
        elif verb == "row":
            self.table[self.key(rest[0])] = rest[1]
        elif verb == "get":
            question, answer = split_arrow(rest)
            assert self.get(question[0]) == answer[0]
        elif verb == "eventually":
            self.eventually(rest)
        else:
            raise AssertionError("no such line: " + verb)

    def option(self, name, value):
        assert self.gate is None, "options come before the first call"
        if name == "coalesce_window_ms":
            self.options["coalesce_window"] = int(value) / 1000
        elif name == "deadline_ms":
            self.options["deadline"] = int(value) / 1000
        elif name == "namespace":
            self.namespace = value
        elif name == "address_policy":
            self.options["address_policy"] = value
        elif name == "addresses":
            self.addresses = [{"gate": self.gate_address, "dead": self.dead}[a] for a in value.split(",")]
        else:
            raise AssertionError("no option " + name)

    def lookup(self, words):
        keys, expected = split_arrow(words)
        client = self.client()
        futures = [client.may_exist_future(self.key(k)) for k in keys]
        answers = []
        for future in futures:
            try:
                answers.append("true" if future.result().may_exist else "false")
            except GateError as error:
                answers.append(error.code().name)
        assert answers == expected, "answers for {}".format(keys)

    def many(self, words):
        (count, prefix), (calls,) = split_arrow(words)
        names = ["{}{}".format(prefix, i) for i in range(int(count))]
        client = self.client()
        before = client.stats().gate_calls
        answers = client.may_exist_many([self.key(n) for n in names])
        assert len(answers) == int(count)
        for _, words in self.lines:
            if words[0] == "add":
                for name in words[1:]:
                    assert answers[names.index(name)].may_exist, name + " was added"
        assert str(client.stats().gate_calls - before) == calls, "calls sent"

    def check_stats(self, checks):
        stats = self.stats()
        for check in checks:
            at_least = ">=" in check
            name, value = check.split(">=" if at_least else "=")
            actual = stats[name]
            holds = actual >= int(value) if at_least else actual == int(value)
            assert holds, "{}: {} is {} ({})".format(check, name, actual, stats)

    def get(self, word):
        value = self.reader.get(self.key(word))
        return "missing" if value is None else value

    def eventually(self, words):
        if words[0] == "get":
            question, answer = split_arrow(words[1:])
            holds = lambda: self.get(question[0]) == answer[0]
        else:
            assert words[0] == "cached", "no such eventually: " + words[0]

            def holds():
                hits = self.reader.stats().cache_hits
                assert self.get(words[1]) == "missing"
                return self.reader.stats().cache_hits > hits

        assert eventually(holds, 30), "not within 30 s"

    def close(self):
        if self.reader is not None:
            self.reader.close()
        if self.gate is not None:
            self.gate.close()


@pytest.mark.parametrize("number,name,lines", CASES, ids=["case {}".format(c[0]) for c in CASES])
def test_conformance_case(conformance_gate, number, name, lines):
    run = Run(number, lines, conformance_gate)
    try:
        for line, words in lines:
            try:
                run.line(words)
            except AssertionError as error:
                raise AssertionError("case {} ({}), cases.txt line {} `{}`: {}".format(number, name, line, " ".join(words), error)) from error
    finally:
        run.close()
