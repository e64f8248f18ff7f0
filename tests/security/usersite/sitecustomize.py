"""Loaded by the throwaway users' interpreter (``test_users.as_user``): the venv's site-packages as a site
directory, so its ``.pth`` files run -- the editable install's finder maps ``datadist.ascend`` to
``runtime/ascend``, which no ``PYTHONPATH`` entry can."""

import os
import site

site.addsitedir(os.environ["DATADIST_TEST_SITE"])
