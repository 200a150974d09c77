"""The documentation site's build: the Reference pages generated from the code, and the MkDocs
hooks that add them to the site (``hooks.py``, named in ``mkdocs.yml``).

Each ``*_page.py`` module is a function from the code to Markdown, with no MkDocs in it, so that
``tests/unit/test_docs_reference.py`` can check what it writes without building the site.
"""
