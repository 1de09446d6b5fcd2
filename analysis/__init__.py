"""Numbers derived from what a run computed, as pure functions of arrays: the statistics registry (statistics.py:
each per-head statistic and head-finding score defined once), the scores and the induction probe (scores.py),
thumbnails and top-k keys (thumbnails.py), rollout (rollout.py), the effect of an ablation (effects.py) and the
teaching roles' checks (roles.py)."""
