"""The trajectory viewer (`trajlake view`, served or exported as static files) and the HTML report
(`trajlake report`): what a lake holds, shown to people. It reads the lake and writes HTML; evaluation itself
(playing held-out tasks, metrics, contamination) is trajlake.evaluate's.

- server.py: `trajlake view`, the server and its entry point; pages.py reads one page's rows at a pinned
  snapshot, export.py every page's in bulk reads; render.py, train_pages.py and evals.py turn rows into HTML
  (pure functions); train_data.py reads what the train and eval pages show; charts.py draws inline SVG;
  markup.py is the one escaping helper, the page frame and its Content-Security-Policy.
- report.py: `trajlake report`, one self-contained page with PNG plots.
"""
