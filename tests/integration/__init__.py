"""Tests over real databases (SQLite and PostgreSQL), processes, the CLI, the dashboard and the docs."""
