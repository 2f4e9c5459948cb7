"""Drop-in replacements for other tools' checkpoint inspection functions."""
