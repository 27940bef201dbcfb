"""A real OpenID Connect provider for the tests: a small Django project of its own on
django-oauth-toolkit's OIDC support (discovery, JWKS, RS256 ID tokens, PKCE required, user
info with a ``groups`` claim), with its own SQLite database in a temporary folder. The tests start
it on a free port (``tests/directory/oidc.py``) and change its users' groups with ``ops``."""
