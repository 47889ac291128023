"""Test fixture: plugins that misbehave (see broken.py and dupe.py)."""
