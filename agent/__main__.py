from agent.app.cli import main

raise SystemExit(main())
