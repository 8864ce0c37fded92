"""Tests of the library's own logic, without a database."""
