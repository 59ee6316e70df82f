"""The long-tail benchmark suite: operators, models, peer backends, runner and reports."""
