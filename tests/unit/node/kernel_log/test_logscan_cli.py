"""`gpuvigil logscan`: JSON contract, table, stdin, garbage, errors, corpus ground truth."""

from __future__ import annotations

import csv
import json

from hypothesis import given, settings
from hypothesis import strategies as st

LOG = "\n".join(
    [
        "[    5.000001] pci 0000:3b:00.0: [10de:2330] type 00 class 0x030200",
        "[  812.441210] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen "
        "off the bus.",
        "[  812.441290] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
        "[  813.000000] NVRM: GPU4 Reset required, caused by previous Xid 79",
        "[  814.120000] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 22013, Non-fatal, Link 33 "
        "Minion Link DLREQ interrupt",
        "[  900.000000] NVRM: Xid (0000:1b:00): 13, Graphics Exception: ESR 0x4041b0=0x3f",
    ]
)


def test_json_contract(run_cli, tmp_path):
    f = tmp_path / "dmesg.log"
    f.write_text(LOG)
    p = run_cli("logscan", str(f), "--json")
    assert p.returncode == 1, p.stderr  # Xid 79's own verdict is FAILED: a failure wins
    events = json.loads(p.stdout)
    assert [(e["kind"], e["code"], e["pci_bus_id"], e["timestamp"]) for e in events] == [
        ("xid", 79, "0000:3b:00", "812.441210"),
        ("sxid", 22013, "0000:07:00.0", "814.120000"),
        ("xid", 13, "0000:1b:00", "900.000000"),
    ]
    assert events[0]["message"] == "GPU has fallen off the bus."
    assert events[0]["pid"] == 4242 and events[0]["process"] == "python3"
    assert events[1]["device"] == "nvidia-nvswitch2"
    assert events[2]["message"] == "Graphics Exception: ESR 0x4041b0=0x3f"
    assert (events[0]["status"], events[0]["action"], events[0]["fatal"]) == (
        "FAILED",
        "REBOOT",
        True,
    )
    assert (events[1]["mnemonic"], events[1]["status"]) == (
        "Minion Link DLREQ interrupt",
        "WARNING",
    )
    assert events[2]["in_catalog"] is True and events[2]["action"] == "RESTART_APP"
    for e in events:
        assert isinstance(e["code"], int)
        assert {"kind", "code", "pci_bus_id", "timestamp", "message"} <= e.keys()


def test_table_garbage_and_stdin(run_cli, tmp_path):
    f = tmp_path / "mixed.log"
    garbage = b"\x00\x01\xff\xfe Xid (PCI:): x\n" * 3 + b"\xc3NVRM: Xid (PCI:0000:3b:00): 48, DBE\n"
    f.write_bytes(garbage + LOG.encode())
    p = run_cli("logscan", str(f))
    assert p.returncode == 1, p.stderr
    assert "79" in p.stdout and "22013" in p.stdout and "4 event(s)" in p.stdout
    assert "REBOOT" in p.stdout
    p = run_cli("logscan", "-", "--json", input=LOG)
    assert p.returncode == 1 and len(json.loads(p.stdout)) == 3
    quiet = "[    1.000000] usb 1-1: new device\n"
    p = run_cli("logscan", "-", input=quiet)
    assert p.returncode == 0 and "no Xid or SXid events" in p.stdout
    only_warnings = "[  9.1] NVRM: Xid (PCI:0000:1b:00): 13, Graphics Exception\n"
    assert run_cli("logscan", "-", input=only_warnings).returncode == 0
    # Not a kernel log, or nothing at all: could not tell, never "no events, fine".
    for text, why in (("no events here\n\x7f\x00", "not a kernel log"), ("", "empty")):
        p = run_cli("logscan", "-", "--json", input=text)
        assert p.returncode == 2 and why in p.stderr, (text, p.stderr)


def test_time_zone_and_year(run_cli):
    line = "Nov 30 08:31:02 gpu-7 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, gone\n"
    p = run_cli("logscan", "-", "--json", "--year", "2026", "--tz", "Europe/Berlin", input=line)
    (ev,) = json.loads(p.stdout)
    assert ev["timestamp"] == "Nov 30 08:31:02"
    assert ev["time"] == "2026-11-30T08:31:02+01:00"
    p = run_cli("logscan", "-", "--tz", "Mars/Olympus", input=line)
    assert p.returncode == 2 and "unknown time zone" in p.stderr


def test_many_events_print_plain_columns(run_cli, tmp_path):
    f = tmp_path / "many.log"
    f.write_text((LOG + "\n") * 400)  # 1200 events: past the rich table's limit
    p = run_cli("logscan", str(f))
    assert p.returncode == 1, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split()[:3] == ["#", "kind", "code"]
    assert lines[1].split()[:3] == ["1", "xid", "79"]
    assert lines[-2].split()[:3] == ["1200", "xid", "13"]
    assert lines[-1].startswith("1200 event(s)")


def test_closed_pipe_is_not_an_error(tmp_path):
    import subprocess

    from testkit import cli_env, gpuvigil_argv

    f = tmp_path / "many.log"
    f.write_text((LOG + "\n") * 3000)
    for extra in ([], ["--json"]):
        p = subprocess.Popen(
            gpuvigil_argv("logscan", str(f), *extra),
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert p.stdout is not None
        p.stdout.readline()
        p.stdout.close()  # like `| head -1`
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err


def test_unreadable_input_exits_2(run_cli, tmp_path):
    p = run_cli("logscan", str(tmp_path / "missing.log"))
    assert p.returncode == 2 and "cannot read" in p.stderr
    p = run_cli("logscan", str(tmp_path))
    assert p.returncode == 2


def test_corpus_ground_truth(run_cli, corpus):
    with (corpus / "kernel_logs" / "MANIFEST.tsv").open() as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    for row in rows:
        p = run_cli("logscan", str(corpus / "kernel_logs" / row["file"]), "--json")
        events = json.loads(p.stdout)
        failed = any(e["status"] == "FAILED" for e in events)
        assert p.returncode == (1 if failed else 0), p.stderr
        xids: list[int] = []
        for e in events:
            if e["kind"] == "xid" and e["code"] not in xids:
                xids.append(e["code"])
        assert xids == [int(c) for c in row["xid_codes_present"].split(",") if c], row["file"]
        sx = {int(c) for c in row["sxid_codes_present"].split(",") if c}
        assert {e["code"] for e in events if e["kind"] == "sxid"} == sx
        assert {f"PCI:{e['pci_bus_id']}" for e in events} == set(
            row["pci_bus_ids_present"].split(";")
        )
        notes = dict(p.strip().split("=") for p in row["notes"].split(";")[:2])
        assert len(events) == int(notes["xid_event_lines"]) + int(notes["sxid_event_lines"])


def test_a_quiet_log_loads_neither_the_catalog_nor_rich(tmp_path):
    """Start-up is most of logscan's cost on an ordinary log (docs/performance.md): with
    no event and `--json`, neither the catalog (YAML, its pydantic models) nor the
    report models nor the table (rich) load. (pydantic itself comes with typer.)"""
    import subprocess
    import sys

    from testkit import cli_env

    f = tmp_path / "quiet.log"
    f.write_text(LOG.splitlines()[0] + "\n")
    probe = (
        "import sys\nfrom gpuvigil import cli\n"
        f"try:\n    cli.main(['logscan', {str(f)!r}, '--json'])\nexcept SystemExit as e:\n"
        "    print('EXIT', e.code)\n"
        "print('MODULES ' + ' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", probe], env=cli_env(), capture_output=True,
                         text=True, timeout=120).stdout  # fmt: skip
    assert "EXIT 0" in out, out
    loaded = out.rsplit("MODULES ", 1)[-1].split()
    heavy = [m for m in loaded if m.split(".")[0] in {"rich", "yaml"}]
    heavy += [m for m in loaded if m.startswith(("gpuvigil.node.catalog", "gpuvigil.core.findings",
                                                 "gpuvigil.node.config"))]  # fmt: skip
    assert loaded and not heavy, heavy


def test_verdicts_are_remembered_within_bounds():
    """One catalog lookup per distinct (kind, code, text); a log of endless distinct texts
    (or very long ones) does not grow the memo without bound."""
    from gpuvigil.commands import logscan
    from gpuvigil.node.checks.kernel_log.kernel_log_parser import parse_line

    verdicts = logscan.Verdicts()
    line = LOG.splitlines()[1]
    first = verdicts.of(parse_line(line))
    assert verdicts.of(parse_line(line)) is first
    assert (first["status"], first["action"], first["fatal"]) == ("FAILED", "REBOOT", True)
    for n in range(logscan._MEMO_SIZE + 10):
        verdicts.of(parse_line(line.replace("bus.", f"bus {n}.")))
    assert len(verdicts._seen) <= logscan._MEMO_SIZE
    long = parse_line(line.replace("bus.", "x" * (logscan._MEMO_TEXT + 1)))
    assert verdicts.of(long)["status"] == "FAILED"
    assert long.message not in {key[2] for key in verdicts._seen}


def test_a_failed_event_wins_over_the_size_cap(run_cli, tmp_path):
    # One exit rule for logscan and analyze: a definite failure is exit 1 even when the
    # rest of the input could not be read (over --max-bytes), never 2.
    fatal = (
        "[  10.000001] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
    )
    f = tmp_path / "big.log"
    f.write_text(fatal + "[  11.000000] usb 1-1: new device\n" * 2000)
    p = run_cli("logscan", str(f), "--max-bytes", "4096")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "over --max-bytes" in p.stderr
    p = run_cli("analyze", str(f), "--max-bytes", "4096", "--json")
    assert p.returncode == 1, p.stdout + p.stderr
    quiet = tmp_path / "quiet.log"
    quiet.write_text("[  11.000000] usb 1-1: new device\n" * 2000)
    assert run_cli("logscan", str(quiet), "--max-bytes", "4096").returncode == 2


def test_run_returns_the_one_exit_table(tmp_path, capsys):
    # In process (no subprocess: fast): `run` answers in CliExit, and a FAILED Xid line
    # in an input over the size cap is still FAILED (1), not "could not tell" (2).
    from gpuvigil.commands import logscan
    from gpuvigil.core.cli_exit import CliExit

    fatal = (
        "[  10.000001] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
    )
    noise = "[  11.000000] usb 1-1: new device\n" * 2000
    big, quiet = tmp_path / "big.log", tmp_path / "quiet.log"
    big.write_text(fatal + noise)
    quiet.write_text(noise)
    opts = {"as_json": True, "year": None, "tz": "UTC", "read_timeout": 10.0, "max_bytes": 4096}
    status = logscan.run(str(big), **opts)
    assert status is CliExit.FAILED, capsys.readouterr()
    assert "over --max-bytes" in capsys.readouterr().err
    assert logscan.run(str(quiet), **opts) is CliExit.CANNOT_TELL
    assert logscan.run(str(quiet), **{**opts, "max_bytes": 1 << 30}) is CliExit.OK
    assert logscan.run(str(big), **{**opts, "tz": "Nowhere/Else"}) is CliExit.CANNOT_TELL


def test_an_out_of_range_code_is_an_event_not_a_dropped_line(run_cli, tmp_path):
    f = tmp_path / "odd.log"
    f.write_text(
        "[  10.000001] NVRM: Xid (PCI:0000:3b:00): 99999, pid=1, name=x, odd\n"
        f"[  10.000002] NVRM: Xid (PCI:0000:3b:00): {'9' * 40}, pid=1, name=x, odder\n"
    )
    p = run_cli("logscan", str(f), "--json")
    events = json.loads(p.stdout)
    assert p.returncode == 1, p.stdout + p.stderr
    assert len(events) == 2 and all(not e["in_catalog"] for e in events), events
    assert all(e["status"] == "FAILED" for e in events)


def test_a_negative_or_unreadable_code_is_an_event_in_logscan_and_analyze(run_cli, tmp_path):
    # Neither a negative nor a non-numeric code drops the line: each is an unknown Xid,
    # FAILED (INVESTIGATE), in logscan and in analyze, the printed code in the message.
    f = tmp_path / "odd.log"
    f.write_text(
        "[  10.000002] NVRM: Xid (PCI:0000:ab:00): -5, pid=1, name=x, neg\n"
        "[  10.000003] NVRM: Xid (PCI:0000:ab:00): abc, pid=1, name=x, nonnum\n"
    )
    p = run_cli("logscan", str(f), "--json")
    assert p.returncode == 1, p.stdout + p.stderr
    events = json.loads(p.stdout)
    assert [(e["code"], e["status"], e["in_catalog"]) for e in events] == [
        (-5, "FAILED", False),
        (-1, "FAILED", False),
    ]
    assert events[1]["message"] == "[unreadable code 'abc'] nonnum"
    p = run_cli("analyze", str(f), "--json")
    assert p.returncode == 1, p.stdout + p.stderr
    found = {x["code"]: x for x in json.loads(p.stdout)["findings"]}
    assert {"XID_-5", "XID_-1"} <= found.keys(), found
    assert all(found[c]["family"] == "GPUXidError" for c in ("XID_-5", "XID_-1"))


def test_event_text_is_what_the_encoder_writes():
    """`--json` writes each event from its fields (`event_text`), not through a dict: the
    text must stay the standard encoder's, byte for byte, for every kind of field."""
    from datetime import UTC, datetime

    from gpuvigil.commands import logscan
    from gpuvigil.node.checks.kernel_log.kernel_log_parser import parse_kmsg_record, parse_line

    lines = [
        *LOG.splitlines(),
        '[Mon Nov 30 07:31:02 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name="q\\ é", x\tz',
        "2026-11-30T07:31:02,123456+01:00 NVRM: Xid (PCI:0000:3b:00): 48, DBE \x1b[31m\u2028",
        "Nov 30 07:31:02 host kernel: NVRM: Xid (0000:3b:00): 999999999999999999999, unknown",
    ]
    events = [parse_line(ln, year=2026) for ln in lines]
    events.append(parse_kmsg_record(b"4,1234,812441210,-;NVRM: Xid (PCI:0000:3b:00): 94, Ch 1"))
    events = [ev for ev in events if ev is not None]
    events.append(events[0].with_(time=datetime(2026, 1, 2, tzinfo=UTC), uptime_s=float("nan")))
    assert len(events) == 8
    verdicts = logscan.Verdicts()
    for ev in events:
        verdict = verdicts.of(ev)
        assert logscan.event_text(ev, verdict) == logscan._ENCODE(logscan.event_json(ev, verdict))
        assert logscan.event_text(ev) == logscan._ENCODE(logscan.event_json(ev))


def test_fast_path_runs_only_what_typer_reads_the_same(tmp_path, capsys):
    """`python -m gpuvigil logscan ...` runs without typer (`fast_path`) when it reads
    every word of the command line; anything else goes to typer, with its messages."""
    from gpuvigil.commands.logscan import fast_path

    f = tmp_path / "dmesg.log"
    f.write_text(LOG)
    for argv in (["logscan", "--help"], ["logscan"], ["logscan", str(f), "--jsn"],
                 ["logscan", str(f), "--year", "20x6"], ["logscan", str(f), "--json", "--json"],
                 ["logscan", str(f), "--read-timeout", "0.01"], ["logscan", "--", str(f)],
                 ["logscan", str(f), str(f)], ["analyze", str(f)]):  # fmt: skip
        assert fast_path(argv) is None, argv
    assert fast_path(["logscan", str(f), "--json", "--year=2026", "--tz", "UTC"]) == 1
    fast = capsys.readouterr().out
    assert json.loads(fast)[0]["code"] == 79
    from gpuvigil.cli import app

    try:
        app(args=["logscan", str(f), "--json", "--year=2026", "--tz", "UTC"])
    except SystemExit as e:
        assert e.code == 1
    assert capsys.readouterr().out == fast


def _both_paths(line: str) -> bool:
    """`--json`'s own writing of the common line gives what the general path gives; True
    when it took the line."""
    from gpuvigil.commands import logscan
    from gpuvigil.node.checks.kernel_log.kernel_log_parser import event_fields

    at = line.find("Xid (")
    if at < 0:
        return False
    of = logscan.Verdicts().of_text
    fast = logscan._common_text(line, at, of)
    fields = event_fields(line, at)
    if fast is None:
        return False
    assert fields is not None, line
    verdict = of(fields[0], fields[1], fields[4])
    assert fast == (logscan.fields_text(fields, verdict), verdict), line
    assert json.loads(fast[0])["line"] == line
    return True


def test_the_common_line_is_written_as_the_general_path_writes_it(corpus):
    lines = [
        *LOG.splitlines(),
        "[  1.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=007, name= q\\ é\u2028 , x\tz",
        "[  1.5] NVRM: Xid (PCI:0000:3b:00): -13, pid='<unknown>', name=<unknown>, m",
        "[  1.5] NVRM: Xid (PCI:0000:3b:00): 999999999999999999999999, pid='12', Ch",
        "[  1.5] NVRM: Xid (zz): 48, DBE \x1b[31m",  # no bus id
        "[  1.5] NVRM: Xid (PCI:0000:3b:00): 0x4f, odd code",  # the general path's
        "[  1.5] nvidia-nvswitch3: Xid (PCI:0000:3b:00): 1, a switch's plain Xid: no event",
        "[  1.5] kern: NVRM: Xid (PCI:0000:3b:00): 79, talos-ish",
        "[  1.5]NVRM:Xid (PCI:0000:3b:00): 79,",
        "[ 99999999999.999999999] fooXid (PCI:0000:3b:00): 79, look-behind",
        "[  1.5] x [  2.5] NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=a, b",
    ]
    for path in sorted((corpus / "kernel_logs").iterdir()):
        lines += [ln for ln in path.read_text(errors="replace").splitlines() if "Xid (" in ln]
    taken = sum(_both_paths(line) for line in lines)
    assert taken >= 10 and taken < len(lines)  # both paths ran


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["[  812.441210] ", "[812.4]", "[ 1.2] [ 3.4] ", "[x] ", "["]),
    st.sampled_from(["NVRM: ", "nvidia-nvswitch1: S", "nvidia-nvswitch1: ", "", "kern: "]),
    st.sampled_from(["Xid (PCI:0000:3b:00): ", "Xid (0000:3b:00.0): ", "Xid (): ", "Xid (a b): "]),
    st.text(alphabet="0123456789-x ,'=<>unknowpidame\t\"\\é", max_size=40),
)
def test_any_line_is_written_as_the_general_path_writes_it(
    stamp: str, who: str, event: str, rest: str
) -> None:
    _both_paths(stamp + who + event + rest)
