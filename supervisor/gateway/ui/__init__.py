"""``GET /ui``: the admin picture as a web page, for people who never open tmux."""
