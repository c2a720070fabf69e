"""Published configurations of the models the preflight knows without a download (JSON; sources in README.md)."""
