"""What the teaching staff publish from the per-student result files: leaderboards, feedback and exports.

Every module here reads the `<student>.json` files the grader writes (through `results.load_results`, which is
strict so a format drift fails loudly) and turns them into pages and files:

- `leaderboard`: the class table (CSV, Markdown, self-contained HTML with plots) and the open-stage ranking;
- `feedback`: one page per student (Markdown and HTML);
- `exports`: Gradescope `results.json` per student and a gradebook CSV for an LMS.

`figures` holds the numbers all three read from a stage's record, `pseudonyms` the names used for publishing,
`plots` the charts, and `render` the templates and table formatting they share.
"""
