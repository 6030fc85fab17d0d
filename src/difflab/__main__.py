from difflab.cli import main

raise SystemExit(main())
