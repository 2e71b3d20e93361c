"""The core commands through the CLI (click's CliRunner): init, ship, verify, log, receipt, demo, errors."""

from __future__ import annotations

import json
import subprocess
import sys

from sqlalchemy import text

from ledger.chain import db as db_mod
from ledger.capture import spool
from ledger.chain.entries import Kind, make_entry


def _job_records(job="55"):
    key = dict(cluster="c1", job_id=job, run=0, node="n01")
    return [make_entry(Kind.ALLOCATION_STARTED, "2026-11-01T10:00:00Z", {"account": "acme", "partition": "gpu",
                                                                        "qos": "high"}, **key).to_record(),
            make_entry(Kind.DEVICE_BOUND, "2026-11-01T10:00:00Z", {"index": 0, "sku": "H100-SXM5-80GB"},
                       device="GPU-aaa", **key).to_record(),
            make_entry(Kind.ALLOCATION_ENDED, "2026-11-01T12:00:00Z", {"exit_code": 0}, **key).to_record()]


def test_init_ship_verify_receipt_end_to_end(runner, cli, tmp_path, ledger_url):
    sp = tmp_path / "spool"
    spool.write(sp, _job_records())
    env = {"IPLEDGER_SPOOL": str(sp), "IPLEDGER_CONFIG": ""}
    r = runner.invoke(cli, ["--db", ledger_url, "init", "--json"], env=env)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["revision"] == "0001" or json.loads(r.output)["revision"]
    r = runner.invoke(cli, ["--db", ledger_url, "ship", "--json"], env=env)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["appended"] == 3
    r = runner.invoke(cli, ["--db", ledger_url, "verify"], env=env)
    # The 3 shipped entries plus the receipt the shipper issued on its own for the ended run.
    assert r.exit_code == 0 and "ok: 4 entries" in r.output, r.output
    r = runner.invoke(cli, ["--db", ledger_url, "log", "--json", "--kind", "receipt_issued"], env=env)
    issued = json.loads(r.output)
    assert [(e["job_id"], e["seq"]) for e in issued] == [("55", 4)]
    r = runner.invoke(cli, ["--db", ledger_url, "receipt", "55", "--format", "json"], env=env)
    assert r.exit_code == 0, r.output
    rec = json.loads(r.output)
    assert rec["job"]["account"] == "acme" and rec["job"]["devices"][0]["uuid"] == "GPU-aaa"
    assert rec["window"] == {"start": "2026-11-01T10:00:00Z", "end": "2026-11-01T12:00:00Z"}
    r = runner.invoke(cli, ["--db", ledger_url, "log", "--json", "--kind", "device_bound"], env=env)
    assert [e["device"] for e in json.loads(r.output)] == ["GPU-aaa"]


def test_verify_cli_names_the_tampered_sequence(runner, cli, tmp_path, sqlite_url):
    sp = tmp_path / "spool"
    spool.write(sp, _job_records())
    assert runner.invoke(cli, ["--db", sqlite_url, "ship", "--spool", str(sp)]).exit_code == 0
    eng = db_mod.make_engine(sqlite_url)
    with eng.begin() as conn:
        conn.execute(text("DROP TRIGGER entries_no_update"))
        conn.execute(text("UPDATE entries SET payload = :p WHERE seq = 3"), {"p": '{"exit_code":1}'})
    eng.dispose()
    r = runner.invoke(cli, ["--db", sqlite_url, "verify"])
    assert r.exit_code == 1
    assert "seq 3" in r.output


def test_commands_on_an_uninitialised_database_fail_in_one_line(runner, cli, tmp_path):
    (tmp_path / "none.db").touch()   # a database without the schema (a missing file: tests/test_edges.py)
    r = runner.invoke(cli, ["--db", str(tmp_path / "none.db"), "verify"])
    assert r.exit_code == 1
    assert r.output.strip().count("\n") == 0 and "ipledger init" in r.output


def test_unknown_job_is_a_one_line_error(runner, cli, sqlite_url):
    r = runner.invoke(cli, ["--db", sqlite_url, "receipt", "424242"])
    assert r.exit_code == 1 and "no entries" in r.output


def test_missing_config_file_named_in_error(runner, cli, tmp_path):
    r = runner.invoke(cli, ["--config", str(tmp_path / "nope.toml"), "verify"])
    assert r.exit_code == 1 and "nope.toml" in r.output


def test_lazy_command_table_matches_what_the_modules_register():
    import importlib

    main = importlib.import_module("ledger.cli.main")  # `from ledger.cli import main` is the console script

    registered = {}
    for module in main.COMMAND_MODULES:
        for name in main.commands_of(module):
            registered[name] = module
    assert registered == main.COMMAND_HOMES


def test_help_listing_is_the_one_click_prints_with_every_module_imported():
    """`ipledger --help` lists the commands from main.COMMAND_HELP; it must be, byte for byte, what click prints
    from the commands themselves (a changed docstring without the table fails here)."""
    import importlib

    import click

    main = importlib.import_module("ledger.cli.main")  # `from ledger.cli import main` is the console script
    assert set(main.COMMAND_HELP) == set(main.COMMAND_HOMES)

    def listing(format_commands) -> str:
        ctx = click.Context(main.cli, info_name="ipledger")
        formatter = ctx.make_formatter()
        format_commands(main.cli, ctx, formatter)
        return formatter.getvalue()

    eager = listing(click.Group.format_commands)  # imports every command module
    assert listing(main.LazyGroup.format_commands) == eager
    for name in main.COMMAND_HOMES:
        cmd = main.cli.get_command(click.Context(main.cli), name)
        assert main.COMMAND_HELP[name] == cmd.get_short_help_str(limit=10**6), name


def test_every_command_has_help_with_an_example(runner, cli):
    import click

    def walk(group, prefix):
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            yield prefix + [name], cmd
            if isinstance(cmd, click.Group):
                yield from walk(cmd, prefix + [name])

    for argv, cmd in walk(cli, []):
        r = runner.invoke(cli, argv + ["--help"])
        assert r.exit_code == 0, argv
        if not hasattr(cmd, "commands"):
            assert "Example" in r.output, f"`ipledger {' '.join(argv)} --help` has no example"


def test_demo_runs_and_says_where_its_output_is(runner, cli, tmp_path):
    r = runner.invoke(cli, ["demo", "--out", str(tmp_path / "d")])
    assert r.exit_code == 0, r.output
    assert str(tmp_path / "d") in r.output
