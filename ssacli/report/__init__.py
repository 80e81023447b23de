"""Presenting results: terminal tables (rich), JSON files, figures."""
