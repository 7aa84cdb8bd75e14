from voxrelay.cli import main

main()
