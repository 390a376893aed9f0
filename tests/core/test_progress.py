"""The side channel between a chapter's kernel and the book build's terminal."""

import io

from fedlib.app import progress


def test_report_appends_events_that_the_reader_gets_once(tmp_path, monkeypatch):
    channel = tmp_path / "events.jsonl"
    reader = progress.ProgressFile(channel)
    assert reader.read() == []  # no file yet
    monkeypatch.setenv(progress.ENV, str(channel))
    progress.report("batch", total=2)
    progress.report("run", cached=True, wall=0.0)
    events = reader.read()
    assert [e["event"] for e in events] == ["batch", "run"] and events[0]["total"] == 2
    assert reader.read() == []
    with open(channel, "a") as handle:  # half a line waits for its end
        handle.write('{"event": "run", "cac')
    assert reader.read() == []
    with open(channel, "a") as handle:
        handle.write('hed": false}\n')
    assert reader.read() == [{"event": "run", "cached": False}]


def test_report_without_a_channel_does_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    progress.report("run", cached=True)
    monkeypatch.setenv(progress.ENV, str(tmp_path / "missing" / "dir" / "file"))
    progress.report("run", cached=True)  # an unwritable channel never breaks a run


def test_bar_counts_runs_and_estimates_the_time_left():
    now = [100.0]
    out = io.StringIO()
    bar = progress.ChapterBar("[1/2] celm", expected_seconds=300.0, remaining_after=60.0, expected_runs=10,
                              stream=out, log_every=30.0, clock=lambda: now[0])
    bar.update([{"event": "batch", "total": 4}, {"event": "run", "cached": True}, {"event": "run", "cached": False}])
    now[0] += 100.0
    # 300 s expected, 100 s elapsed: 200 s of this chapter, then 60 s of the next ones
    assert bar.remaining() == 260.0
    assert bar.line() == ("    [1/2] celm [####....................] 2/10 runs, 1 cached, 1 min 40 s, "
                          "about 4 min 20 s left")
    bar.draw()
    assert out.getvalue().endswith("left\n")  # not a TTY: plain lines, at most every 30 s
    bar.draw()
    assert out.getvalue().count("\n") == 1


def test_without_stored_timings_the_estimate_comes_from_the_runs_done():
    now = [0.0]
    bar = progress.ChapterBar("x", expected_seconds=None, remaining_after=0.0, stream=io.StringIO(),
                              clock=lambda: now[0])
    assert bar.remaining() is None and "no runs yet" in bar.line()
    bar.update([{"event": "batch", "total": 4}, {"event": "run", "cached": False}])
    now[0] = 30.0
    assert bar.remaining() == 90.0  # 1 of 4 runs in 30 s


def test_format_seconds():
    assert [progress.format_seconds(s) for s in (4.4, 65, 3725)] == ["4 s", "1 min 05 s", "1 h 02 min"]


def test_board_shares_one_line_and_divides_the_time_left_by_the_jobs():
    now = [0.0]
    out = io.StringIO()
    board = progress.Board(jobs=2, stream=out, log_every=10.0, clock=lambda: now[0])
    celm = progress.ChapterBar("celm", 200.0, 0.0, expected_runs=12, stream=out, clock=lambda: now[0])
    fedms = progress.ChapterBar("fedms", 100.0, 0.0, expected_runs=4, stream=out, clock=lambda: now[0])
    board.bars.update(celm=celm, fedms=fedms)
    board.queued_seconds = 300.0
    celm.update([{"event": "run", "cached": False}] * 6)
    now[0] = 50.0
    # (150 s left of celm + 50 s of fedms + 300 s queued) / 2 jobs
    assert board.remaining() == 250.0
    assert board.line() == "    celm [######......] 6/12 | fedms [............] 0/4 | about 4 min 10 s left"
    board.draw()
    assert out.getvalue() == board.line() + "\n"


def test_a_stage_shows_what_a_chapter_does_between_runs():
    now = [0.0]
    bar = progress.ChapterBar("[6/11] fedscm", expected_seconds=None, remaining_after=0.0, stream=io.StringIO(),
                              clock=lambda: now[0])
    bar.update([{"event": "stage", "name": "local training of 100 clients"}])
    assert bar.short() == "[6/11] fedscm local training of 100 clients"  # no runs announced yet
    assert bar.line() == "    [6/11] fedscm [........................] no runs yet " \
                         "(local training of 100 clients), 0 s"
    bar.update([{"event": "batch", "total": 4}, {"event": "stage", "name": "FedAvg on 100 client(s)",
                                                 "done": 2, "total": 9}])
    assert bar.short() == "[6/11] fedscm [............] 0/4 FedAvg on 100 client(s) 2/9"


def test_a_cached_scm_federation_reports_a_cached_run(tmp_path, monkeypatch):
    """A FedSCM federation announces itself on the channel as a run, here a cached one."""
    from fedlib import scm_pipeline
    from fedlib.cache import ResultCache
    from fedlib.config import ScmConfig

    channel = tmp_path / "events.jsonl"
    monkeypatch.setenv(progress.ENV, str(channel))
    cache = ResultCache(tmp_path / "runs")
    config = ScmConfig.make({"dataset": "fmnist", "n_clients": 10})
    cache.put(config.key(), {"config": config.to_dict(), "result": {"config": config.to_dict(), "methods": {},
                                                                    "meta": {}}})
    scm_pipeline.run_pipeline(config, cache=cache)
    assert [(e["event"], e["cached"]) for e in progress.ProgressFile(channel).read()] == [("run", True)]
