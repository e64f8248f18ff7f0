from .process.cli import main

raise SystemExit(main())
