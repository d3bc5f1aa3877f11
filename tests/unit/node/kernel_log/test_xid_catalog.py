"""The Xid/SXid catalog: shipped data, the disputed codes, families, overrides, fail-closed."""

from __future__ import annotations

import pytest

from gpuvigil.core.config import ConfigError, validate
from gpuvigil.core.findings import Action, Status
from gpuvigil.node.catalog.xid import CatalogOverrides, load_catalog
from gpuvigil.node.config import NodeConfig

OK, WARN, FAIL = Status.OK, Status.WARNING, Status.FAILED
A = Action


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


def test_every_catalog_code_is_known(cat):
    assert cat.codes("xid") == list(range(1, 173))
    assert len(cat.codes("sxid")) == 93
    for code in cat.codes("xid"):
        for fam in (None, "volta", "ampere", "hopper", "blackwell"):
            assert cat.rule("xid", code, fam).known


@pytest.mark.parametrize(
    ("code", "status", "action", "fatal"),
    [
        (13, WARN, A.RESTART_APP, False),
        (31, WARN, A.RESTART_APP, False),
        (43, OK, A.NONE, False),
        (45, WARN, A.RESTART_APP, False),
        (48, FAIL, A.RESET_GPU, True),
        (54, FAIL, A.INVESTIGATE, True),
        # the disputed six (evidence in xid.yaml and docs/kernel-log.md)
        (63, WARN, A.RESET_GPU, False),
        (68, WARN, A.RESTART_APP, False),
        (92, OK, A.NONE, False),
        (94, WARN, A.RESTART_APP, False),
        (95, FAIL, A.RESET_GPU, True),
        (109, FAIL, A.RESET_GPU, True),
        (64, FAIL, A.REPLACE, True),
        (74, FAIL, A.RESET_GPU, True),
        (79, FAIL, A.REBOOT, True),
        (119, FAIL, A.RESET_GPU, True),
        (1, FAIL, A.INVESTIGATE, False),  # "Unused": seeing one is odd, a human looks
    ],
)
def test_outcomes(cat, code, status, action, fatal):
    o = cat.rule("xid", code, "hopper").outcome
    assert (o.status, o.action, o.fatal) == (status, action, fatal)


def test_unknown_codes_fail_closed(cat):
    for kind, code in (("xid", 9999), ("sxid", 1)):
        r = cat.rule(kind, code)
        assert not r.known
        assert (r.outcome.status, r.outcome.action) == (FAIL, A.INVESTIGATE)


@pytest.mark.parametrize(
    ("code", "status", "action", "fatal"),
    [
        (11004, WARN, A.NONE, False),
        (20034, FAIL, A.REBOOT, True),
        (22003, FAIL, A.REBOOT, True),
        (10005, OK, A.NONE, False),
    ],
)
def test_sxid_classes(cat, code, status, action, fatal):
    o = cat.rule("sxid", code).outcome
    assert (o.status, o.action, o.fatal) == (status, action, fatal)


def test_volta_uses_the_older_catalog(cat):
    assert cat.rule("xid", 63, "Volta").name == "ECC_PAGE_RETIREMENT_EVENT"
    assert cat.rule("xid", 63, "pascal").name == "ECC_PAGE_RETIREMENT_EVENT"
    assert cat.rule("xid", 63, "Hopper").name == "INFOROM_DRAM_RETIREMENT_EVENT"
    assert cat.rule("xid", 63, None).name == "INFOROM_DRAM_RETIREMENT_EVENT"


@pytest.mark.parametrize(
    ("code", "message", "status", "action"),
    [
        (144, "SAW_MVB Nonfatal XC0 i0 Link 04 (0x00000001 0x0)", WARN, A.NONE),
        (149, "NETIR_LINK_EVT Fatal XC0 i0 Link 17 (0x025001c6 0x0)", FAIL, A.RESET_GPU),
        (
            154,
            "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
            FAIL,
            A.RESET_GPU,
        ),
        (
            154,
            "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            FAIL,
            A.REBOOT,
        ),
        (
            154,
            "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)",
            OK,
            A.NONE,
        ),
        (154, "something new", WARN, A.NONE),
    ],
)
def test_message_rules(cat, code, message, status, action):
    o = cat.rule("xid", code).outcome_for(message)
    assert (o.status, o.action) == (status, action)


def test_overrides_merge_per_field():
    ov = CatalogOverrides.model_validate(
        {
            "xid": {
                109: {"status": "WARNING", "action": "RESTART_APP", "fatal": False},
                4242: {"status": "FAILED", "action": "RESET_GPU", "description": "x"},
            },
            "families": {"hopper": {"boot_noise": [43]}},
            "default_window_s": 60,
        }
    )
    cat = load_catalog(ov)
    r = cat.rule("xid", 109)
    assert (r.outcome.status, r.outcome.action, r.name) == (
        WARN,
        A.RESTART_APP,
        "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR",
    )
    assert cat.rule("xid", 4242).known
    assert cat.boot_noise("hopper") == {43}
    assert cat.rule("xid", 13).window_s == 60


@pytest.mark.parametrize(
    ("data", "key", "problem"),
    [
        ({"xid": {79: {"acton": "REBOOT"}}}, "node.kernel_log.xid.79.acton", "unknown key"),
        ({"xid": {79: {"action": "REBOOTT"}}}, "node.kernel_log.xid.79.action", "Input"),
        ({"xid": {79: {"bucket": "NOPE"}}}, "node.kernel_log", "xid.79: unknown bucket"),
        ({"xid": {5000: {"name": "x"}}}, "node.kernel_log", "xid.5000: needs a bucket"),
        ({"families": {"hopper": {"boot_noise": [79]}}}, "node.kernel_log", "Xid 79 is fatal"),
        (
            {"xid": {144: {"messages": [{"match": "(", "status": "OK"}]}}},
            "node.kernel_log.xid.144.messages.0.match",
            "regular expression",
        ),
        ({"sources": []}, "node.kernel_log.sources", "at least 1"),
    ],
)
def test_config_errors_name_the_key(data, key, problem):
    from gpuvigil.core.config import StrictModel

    class Root(StrictModel):
        node: NodeConfig

    with pytest.raises(ConfigError) as e:
        validate(Root, {"node": {"kernel_log": data}}, source="gpuvigil.yaml")
    assert e.value.key == key
    assert problem in e.value.problem
    assert "gpuvigil.yaml" in str(e.value)


def test_config_file_overrides_reach_the_catalog(tmp_path):
    from gpuvigil import config

    f = tmp_path / "gpuvigil.yaml"
    f.write_text(
        "node:\n"
        "  kernel_log:\n"
        "    sources: [dmesg, journal]\n"
        "    xid:\n"
        "      109: {status: WARNING, action: RESTART_APP, fatal: false}\n"
        "      '4242': {bucket: RESET_GPU, description: site-specific}\n"
        "    families:\n"
        "      hopper: {boot_noise: [43]}\n"
    )
    cfg = config.load(f, environ={})
    cat = load_catalog(cfg.node.kernel_log)
    assert cat.rule("xid", 109).outcome.status is WARN
    assert cat.rule("xid", 4242).outcome.action is A.RESET_GPU
    assert cat.boot_noise("Hopper") == {43}
    f.write_text("node:\n  kernel_log:\n    xid:\n      79: {severity: FAILED}\n")
    with pytest.raises(ConfigError) as e:
        config.load(f, environ={})
    assert str(f) in str(e.value) and "node.kernel_log.xid.79.severity" in str(e.value)


def test_logscan_base_table_is_the_catalog_resolved():
    """`logscan` reads the base entries from `xid_base.json` (no yaml, no pydantic at its
    start-up): the file must be what the catalog resolves. After editing xid.yaml or
    sxid.yaml, regenerate it: `python -c 'from gpuvigil.node.catalog.xid import
    write_base_table; write_base_table()'`."""
    import json

    from gpuvigil.node.catalog.xid import base_table
    from gpuvigil.node.catalog.xid_base import TABLE, load_table

    with open(TABLE, encoding="utf-8") as f:
        assert json.load(f) == base_table(), "xid_base.json is stale: regenerate it"
    catalog, table = load_catalog(), load_table()
    for kind in ("xid", "sxid"):
        for code in [*catalog.codes(kind), 424242]:
            rule, base = catalog.rule(kind, code), table.rule(kind, code)
            assert (base.name, base.known) == (rule.name, rule.known)
            for text in ("", "GPU has fallen off the bus.", "Non-fatal, Link 3", "to 0x2", "x"):
                want, got = rule.outcome_for(text), base.outcome_for(text)
                assert (got.status, got.action, got.fatal) == (
                    want.status.value,
                    want.action.value,
                    want.fatal,
                )
