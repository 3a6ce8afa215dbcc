from agentlightning.doctor.cli import main

raise SystemExit(main())
