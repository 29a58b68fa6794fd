from tritonkit.cli import main

raise SystemExit(main())
