"""Data in and out of the store in other projects' formats: importers (AgentGym / OpenManus-RL trajectory
files) and the Hugging Face `datasets` export and import."""
