"""Framework integrations (Django, FastAPI, Flask): each imports its framework, so none is
imported by pgqueue itself; they use the core and the worker, never the interfaces."""
