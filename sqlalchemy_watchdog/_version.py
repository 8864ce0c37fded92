"""The package's version: one source, read by setuptools from this file's text
(pyproject.toml) and re-exported as ``sqlalchemy_watchdog.__version__``; a
module of its own so the runner's core reads it without importing the
package's root (which imports the runners)."""

__version__ = "0.1.0"
