"""Defaults that more than one module uses, each defined here once: imported, never copied
(tests/test_defaults_once.py fails on a second definition). A value only one module uses
stays with that module."""

from __future__ import annotations

# A timestamp further past our clock than this is a broken clock or a lie: gossip refuses such
# statistics entries and topology change times, provider reports dated past it, and signed
# frames further off our clock either way (its replay window).
MAX_SKEW_S = 30.0
# Per-request noise of log tokens/s on a quiet LAN mesh: a saturation curve's prior spread,
# and the spread of a route known only through gossip's summary.
OBS_SIGMA = 0.3
# Speed score, in [0, 1], of a provider route with no measurement yet (the FreeLLMAPI seed's
# multi-objective scoring).
SPEED_PRIOR = 0.6
# Probability of scouting an unproven route (ADR-0021 `--route-explore-share`).
EXPLORE_SHARE = 0.3
