"""The package version, in core so that any layer can read it without importing the package root
(whose public API loads the tools lazily: an import of the root from below would be a cycle)."""

VERSION = "0.1.0"
