"""The command-line tools, apart from the library.

``asyncreplica demo``, ``doctor``, ``bench``, ``lint``, ``explain`` and ``trace``
(:mod:`._cli`). Nothing in the library imports this package: it is entered only from the
command line (``asyncreplica``, ``python -m asyncreplica``) and from the public
:mod:`asyncreplica.lint`, which re-exports the static check. The top of the package
shows the library.
"""
