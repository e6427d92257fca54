"""The files a published package has: a licence that matches pyproject, a citation file."""

from __future__ import annotations

from pathlib import Path

import yaml

import pymc_penalty

ROOT = Path(__file__).resolve().parents[1]


def test_license_file_matches_the_declared_license():
    assert 'license = { text = "Apache-2.0" }' in (ROOT / "pyproject.toml").read_text()
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_citation_file_cites_the_package_and_the_papers():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert cff["cff-version"] == "1.2.0"
    assert cff["version"] == pymc_penalty.__version__
    assert cff["license"] == "Apache-2.0"
    titles = {ref["title"] for ref in cff["references"]}
    assert "Exact MCMC with differentially private moves" in titles
    assert "Privacy Guarantees in Posterior Sampling under Contamination" in titles
    dois = {ref.get("doi") for ref in cff["references"]}
    assert "10.1007/s11222-018-9847-x" in dois
