"""The front door: a short README whose results table is the committed metrics', one page per paper, and links
that resolve."""
import json
import re
import shutil
from pathlib import Path

import pytest

from replication.ledger import glance

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "replication/setup/README.md"] + [
    ROOT / f"replication/papers/{p}/README.md" for p in ("elo_evolve", "rlpr", "debate", "malt", "mae")]
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_is_short_and_its_results_table_is_the_committed_metrics():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert glance.replaced(text, glance.table()) == text, "run python -m replication glance"
    assert glance.main(["--check"]) == 0


def test_glance_check_fails_when_a_committed_number_changes(tmp_path):
    metrics = tmp_path / "metrics"
    shutil.copytree(ROOT / "figures/metrics", metrics)
    path = metrics / "03_rlpr_debiasing.json"
    record = json.loads(path.read_text())
    claim = next(c for c in record["claims"] if "beats RLVR" in c["claim"])
    claim["estimate"] += 0.01
    path.write_text(json.dumps(record))
    assert glance.table(metrics) != glance.table()
    assert f"{claim['estimate']:+.3f} [" in glance.table(metrics)   # the changed number, not a committed one


def test_a_pages_table_shows_each_part_of_a_compound_claim_with_its_own_interval():
    """02's Table 1 row is compound (static > point, Elo-Evolve > static): the page's generated table gives each part
    a row of its own under the claim (13a, 13b), with its verdict and interval, as ledger.md does."""
    table = glance.claims_table("02_elo_dynamics")
    claims = json.loads((ROOT / "figures/metrics/02_elo_dynamics.json").read_text())["claims"]
    compound = next(c for c in claims if c.get("parts") and "Table 1" in c["claim"])
    rows = [line for line in table.splitlines() if "| part: " in line]
    for name, part in compound["parts"].items():
        row = next(r for r in rows if f"| part: {name} |" in r)
        assert part["verdict"] in row and f"{part['interval'][0]:+.3f}" in row, row
    number = next(line for line in table.splitlines() if f"| [{compound['claim']}](" in line).split("|")[1].strip()
    assert sum(r.split("|")[1].strip().startswith(number) for r in rows) == len(compound["parts"])


def test_a_pages_table_gives_each_effect_in_the_papers_direction():
    """A row whose paper expects a fall (direction -1) prints the fall as a positive effect, its interval flipped
    and in order, as the page's header and the forest plot say."""
    row = {"interval": [-0.11573, -0.01427], "estimate": -0.065, "direction": -1}
    assert glance._measured(row) == "+0.065 [+0.014, +0.116]"
    assert glance._measured({**row, "direction": 1}) == "-0.065 [-0.116, -0.014]"
    auc = {"interval": [0.525102, 0.709447], "estimate": 0.617275, "direction": 1, "null": 0.5}
    assert glance._measured(auc) == "0.62 [0.53, 0.71]"   # a level against one half, not a difference


def test_a_headline_that_names_no_claim_stops_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(glance, "HEADLINES", (("RLPR", "03_rlpr_debiasing", "x", "no such claim", "p"),))
    with pytest.raises(ValueError, match="glance.HEADLINES: 0 real-model claims of 03_rlpr_debiasing"):
        glance.table()


def test_the_yardstick_row_says_which_seeds_failed_which_check_in_words():
    text = "failed health check: rlvr lr 0.0003 seed 1 (learned, length_ok); rlvr lr 0.0003 seed 2 (learned)"
    assert glance._health_words(text) == (" (seeds 1, 2: training reward did not rise clearly; "
                                          "seed 1: replies collapsed in length)")
    assert glance._health_words(None) == ""
    assert glance._health_words("failed health check: rlvr (learned)") == " (a failed health check: see the page)"


def test_every_paper_and_notebook_00_has_a_page_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    for page in PAGES:
        assert page.exists(), page
        assert str(page.relative_to(ROOT)) in readme, page
    for doc in DOCS:
        assert f"docs/{doc.name}" in readme, doc.name
    assert {d.name for d in DOCS} >= {"statistics.md", "reproducibility.md", "gpu.md", "benchmark.md", "runs.md"}


@pytest.mark.parametrize("page", [ROOT / "README.md"] + PAGES + DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path = target.split("#")[0]
        if path:
            assert (page.parent / path).exists(), f"{page.relative_to(ROOT)}: {target}"


@pytest.mark.parametrize("page", [ROOT / "README.md"] + PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_front_pages_carry_no_dated_run_history(page):
    dated = [line for line in page.read_text().splitlines() if re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    assert not dated, dated[:3]


@pytest.mark.parametrize("page", PAGES[1:], ids=lambda p: p.parent.name)
def test_a_paper_pages_claims_are_the_generated_table_not_a_hand_written_one(page):
    """Each paper page carries its notebooks' claims as the block `python -m replication glance` writes (which
    `glance --check` keeps equal to the committed metrics), never a table typed by hand, whose numbers a re-run would
    leave behind."""
    text = page.read_text()
    blocks = re.findall(r"<!-- claims of (\d\d_\w+): made by `python -m replication glance`", text)
    assert blocks, f"{page.parent.name}: no generated claims table"
    assert all((ROOT / f"figures/metrics/{stem}.json").is_file() for stem in blocks), blocks
    hand_written = re.search(r"From `figures/metrics/\d\d_\w+\.json`", text)
    assert not hand_written, f"{page.parent.name}: a hand-written claims table"


ROW_REF = re.compile(r"\b[Rr]ows? (\d+[a-z]?(?:(?:, | and |-)\d+[a-z]?)*)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.parent.name)
def test_a_pages_prose_cites_only_rows_its_tables_number(page):
    """A "row 12" or "rows 3 and 5" in a page's prose names a row of that page's own claim table: the generated tables
    number rows as the ledger does, so a row number written when the table was numbered otherwise fails here."""
    lines = page.read_text().splitlines()
    numbered = {m.group(1) for line in lines if (m := re.match(r"\|\s*(\d+[a-z]?)\s*\|", line))}
    cited = {n for line in lines if not line.lstrip().startswith("|")
             for m in ROW_REF.finditer(line) for n in re.split(r", | and |-", m.group(1))}
    assert cited <= numbered, f"{page.parent.name}: prose cites row(s) {sorted(cited - numbered)} its tables do not number"
