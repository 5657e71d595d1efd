"""Test-only plugins, loaded through $ADVISOR_PLUGINS (never imported by the package itself)."""
