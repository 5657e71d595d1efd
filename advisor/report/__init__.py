"""`advisor report`: a self-contained HTML report (and PNG plots beside it) of one tuning run.

The source is a config file or a stored study's name. The modules, in the order a report is made:

- `load`: the study (with its per-layer companion) or the config and its trials CSV, read into
  a `ReportData`, with the summary of baseline vs recommendation;
- `importance`: each knob's share of the variance of log time (exact on a complete grid, else
  fANOVA);
- `plots`: the plots, in memory (matplotlib PNG bytes, plotly HTML divs);
- `page`: the HTML page, which needs no network;
- `write`: the files, written last, all or none;
- `layer_rows`: the per-layer rows and their roofline column.

What the console shows comes from here too: `progress` (the live progress and the summary
tables) and `describe` (`advisor show`, `advisor env`).
"""
