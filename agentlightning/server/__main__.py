from agentlightning.server.cli import main

main()
