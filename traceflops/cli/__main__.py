from traceflops.cli.main import main

main()
