"""Tandem: disaggregated LLM serving. What users import and run (SDK, CLI, launcher)."""

__version__ = "0.1.0"
