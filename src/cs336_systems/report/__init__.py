"""Records -> tables and figures -> report/writeup.md."""
