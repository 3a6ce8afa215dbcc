from agentlightning.controller.cli import main

main()
