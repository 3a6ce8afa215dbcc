from agentlightning.evaluation.cli import main

main()
