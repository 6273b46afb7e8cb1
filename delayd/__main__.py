from delayd.cli import main

raise SystemExit(main())
