"""One bibliography: references.bib holds every work the book cites, and the book cites with {cite} only.

book/bibliography.md lists references.bib whole (`:all:`); the chapters cite its entries with {cite:t}`key` or
{cite:p}`key` (sphinxcontrib-bibtex), which the build (-W -n) checks for unknown keys. What the build cannot see, and
this test does: a work named in the prose the author-year way ("Vaswani et al. (2017)", "(Ba et al., 2016)") without
an entry, a {cite} key that exists nowhere, and an entry that nothing cites."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIB_KEY = re.compile(r"^@\w+\{([^,\s]+),", re.M)
CITE = re.compile(r"\{cite(?::\w+)?\}`([^`]+)`")
FENCE = re.compile(r"^(`{3,}|~{3,}).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
NAME = r"[A-Z][A-Za-z\u00c0-\u017f'-]+"
# "Vaswani et al. (2017)", "(Vaswani et al., 2017)", "Zhang and Sennrich (2019)", "(Liu, Zaharia and Abbeel, 2023)",
# "(Shazeer, 2020)": a work named by its authors and year.
AUTHOR_YEAR = re.compile(
    rf"{NAME}(?:\s+et\s+al\.|(?:,\s+{NAME})*\s+and\s+{NAME})\s*\(\d{{4}}[a-z]?\)"
    rf"|\({NAME}(?:\s+et\s+al\.|(?:,\s+{NAME})*\s+and\s+{NAME})?,?\s+\d{{4}}[a-z]?\)"
    rf"|{NAME}\s+et\s+al\.,\s+\d{{4}}"
)
# Works the text relies on that an earlier bibliography left out (issue 26): each must have an entry.
REQUIRED = {"radford2019language", "touvron2023llama", "ba2016layer", "loshchilov2019decoupled",
            "haviv2022transformer", "brandon2023striped", "he2016deep", "zhang2019root", "shazeer2020glu",
            "press2017using", "hendrycks2016gaussian", "black2022gptneox"}


def _bib_keys():
    return BIB_KEY.findall((ROOT / "references.bib").read_text(encoding="utf-8"))


def _texts():
    """{source: the prose of its markdown}: every notebook's markdown cells and the book's pages."""
    texts = {}
    for folder in ("book", "exercises", "solutions"):
        for path in sorted((ROOT / folder).glob("*.ipynb")):
            cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
            texts[str(path.relative_to(ROOT))] = "\n\n".join(
                "".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    for path in sorted((ROOT / "book").glob("*.md")):
        texts[str(path.relative_to(ROOT))] = path.read_text(encoding="utf-8")
    return texts


def _cited(text):
    return {key.strip() for group in CITE.findall(text) for key in group.split(",")}


def _prose(text):
    """The text without code blocks and inline code (where "et al., 2017" is a label, not a citation)."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def test_the_bibliography_page_lists_references_bib_whole():
    page = (ROOT / "book" / "bibliography.md").read_text(encoding="utf-8")
    assert re.search(r"```\{bibliography\}\n:all:\n```", page)
    assert "bibtex_bibfiles: [references.bib]" in (ROOT / "_config.yml").read_text(encoding="utf-8")


def test_keys_are_unique_and_the_required_works_are_there():
    keys = _bib_keys()
    assert len(keys) == len(set(keys)), f"duplicate keys: {sorted(k for k in keys if keys.count(k) > 1)}"
    assert REQUIRED <= set(keys), f"missing from references.bib: {sorted(REQUIRED - set(keys))}"


def test_every_cited_key_has_an_entry_and_every_entry_is_cited():
    keys = set(_bib_keys())
    cited = {(source, key) for source, text in _texts().items() for key in _cited(text)}
    unknown = sorted(f"{source}: {key}" for source, key in cited if key not in keys)
    assert not unknown, "cited but not in references.bib:\n" + "\n".join(unknown)
    uncited = keys - {key for _, key in cited}
    assert not uncited, f"entries of references.bib that no page cites: {sorted(uncited)}"


def test_works_are_cited_with_cite_not_named_by_author_and_year():
    found = [f"{source}: {m.group(0)!r}" for source, text in _texts().items()
             for m in AUTHOR_YEAR.finditer(_prose(text))]
    assert not found, "author-year mentions without {cite} (use {cite:t}`key` or {cite:p}`key`):\n" + "\n".join(found)


@pytest.mark.parametrize("mention", ["Vaswani et al. (2017)", "(Ba et al., 2016)", "Zhang and Sennrich (2019)",
                                     "(Liu, Zaharia and Abbeel, 2023)", "(Shazeer, 2020)", "Haviv et al., 2022",
                                     "(Olsson et\nal., 2022: heads"])
def test_author_year_mentions_are_recognised(mention):
    assert AUTHOR_YEAR.search(f"as shown by {mention}, attention"), mention


@pytest.mark.parametrize("text", ["Llama 2 7B has 32 layers", "in 2017 the transformer", "{cite:t}`ba2016layer`",
                                  "```text\npost-LN (Vaswani et al., 2017):\n```"])
def test_other_text_is_not_taken_for_a_citation(text):
    assert not AUTHOR_YEAR.search(_prose(text))
