from ix_gpu.cli import main

raise SystemExit(main())
